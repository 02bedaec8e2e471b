"""The simulator's limiter (`slo.sim.lanes`): the same order, gate and demotion as
`serving.limiter` and admission give the server, on hand-made waiters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from observe import registry as R
from slo.policy import conditions as P
from slo.sim.engine_model import EngineModel
from slo.sim.lanes import (
    LANE_PRIORITY_STEP,
    LANE_VIP,
    RELEASE_WINDOW_S,
    Lanes,
    engine_priority,
    gate_fits,
    kv_fits,
    kv_reserved_from,
    releases_p90,
    slot_wait_s,
    vips_first,
)
from slo.sim.request import SimRequest
from slo.sim.simulation import Simulator


def waiter(arrival: float, target: float | None = 1.0, prompt: int = 100,
           priority: str = R.PRIORITY_REALTIME, vip: bool = False) -> SimRequest:
    return SimRequest(arrival, prompt, 1, priority=priority, vip=vip, target_s=target)


def test_slots_go_vip_first_then_realtime_earliest_deadline_then_batch():
    lanes = Lanes()
    batch = waiter(0.0, priority=R.PRIORITY_BATCH)
    doc = waiter(0.1, target=1.5)  # due at 1.6
    chat = waiter(0.5, target=0.2)  # due at 0.7: passes the document
    vip = waiter(0.9, vip=True)
    for req in (batch, doc, chat, vip):
        lanes.push(req)
    assert list(lanes.pop_ready(lambda r: True)) == [vip, chat, doc, batch]
    assert not lanes


def test_nobody_passes_a_head_that_does_not_fit():
    lanes = Lanes()
    big, small, later = waiter(0.0, prompt=3000), waiter(0.1, prompt=10), \
        waiter(0.2, priority=R.PRIORITY_BATCH, prompt=10)
    for req in (big, small, later):
        lanes.push(req)
    assert list(lanes.pop_ready(lambda r: r.prompt < 1000)) == []
    assert len(lanes) == 3


def test_a_vip_enters_when_nothing_else_fits():
    """As serving.limiter: VIPs pass the slot limit and the prefill gate."""
    lanes = Lanes()
    doc, vip = waiter(0.0, prompt=3000), waiter(0.5, prompt=3000, vip=True)
    for req in (doc, vip):
        lanes.push(req)
    assert list(lanes.pop_ready(lambda r: False)) == [vip]
    assert len(lanes) == 1


@pytest.mark.parametrize("pending,tokens,gate,fits", [
    (0, 5000, 2048, True),  # an engine with nothing pending takes any prompt
    (1000, 1048, 2048, True),
    (1000, 1049, 2048, False),
    (9000, 10, None, True),  # no gate
])
def test_the_prefill_gate(pending, tokens, gate, fits):
    assert gate_fits(pending, tokens, gate) is fits


@pytest.mark.parametrize("kv_free,pending,tokens,reserve,in_engine,fits", [
    (3000, 500, 1500, 1000, 2, True),  # exactly the reserve left
    (3000, 500, 1501, 1000, 2, False),  # one token into it
    (3000, 0, 2001, 1000, 2, False),
    (100, 5000, 9000, 1000, 0, True),  # an empty engine takes anything
    (100, 5000, 9000, None, 3, True),  # no reserve
    (-50, 0, 1, 0, 1, False),  # a cache read past full: nothing fits a reserve of 0
])
def test_the_vip_reserve(kv_free, pending, tokens, reserve, in_engine, fits):
    assert kv_fits(kv_free, pending, tokens, reserve, in_engine) is fits


@pytest.mark.parametrize("lane,reserve,reserved", [
    (LANE_VIP, 1024, 0), (R.PRIORITY_REALTIME, 1024, 1024), (R.PRIORITY_BATCH, 1024, 1024),
    (R.PRIORITY_REALTIME, None, 0)])
def test_the_reserve_is_out_of_reach_for_all_but_vips(lane, reserve, reserved):
    assert kv_reserved_from(lane, reserve) == reserved


def test_work_ahead_is_the_lanes_before_and_those_due_earlier_in_its_own():
    lanes = Lanes()
    vip, early, late, batch = (waiter(0.0, vip=True), waiter(0.0, target=0.5),
                               waiter(0.0, target=2.0), waiter(0.0, priority=R.PRIORITY_BATCH))
    for req in (vip, early, late, batch):
        lanes.push(req)
    assert list(lanes.ahead(R.PRIORITY_REALTIME, 1.0)) == [vip, early]
    assert set(map(id, lanes.ahead(R.PRIORITY_BATCH, 5.0))) == set(map(id, [vip, early, late,
                                                                            batch]))


def test_a_realtime_waiter_too_late_for_its_slot_moves_to_the_batch_lane():
    lanes = Lanes()
    late, fine, untimed = waiter(0.0, target=0.2), waiter(0.0, target=1.0), \
        waiter(0.0, target=None)
    for req in (late, fine, untimed):
        lanes.push(req)
    lanes.demote_late(0.15, lambda r: 0.1)  # 0.2 - 0.1 < 0.15: only `late`
    assert late.priority == R.PRIORITY_BATCH and late.actions == ["demote:deadline"]
    assert fine.actions == untimed.actions == []
    assert list(lanes.pop_ready(lambda r: True)) == [untimed, fine, late]


@pytest.mark.parametrize("limit,ahead,releases", [
    (7, 1, 2),  # free, but one waits before it: its release, then its own
    (6, 0, 1),
    (4, 0, 3),  # two over the limit leave first (as `serving.limiter`'s slot wait)
    (2, 1, 6),
])
def test_the_simulated_slot_wait_counts_every_request_over_the_limit(limit, ahead, releases):
    """Six running, four releases over the 10 s window: one every 2.5 s."""
    expected = releases_p90(releases) * 2.5
    model = EngineModel(0.01, 0.001, 1e-4, 1e-8, token_budget=2048, kv_capacity_tokens=30_000)
    sim = Simulator(model, None, limit=limit)
    sim.now = 20.0
    sim.running = [waiter(0.0) for _ in range(6)]
    sim.releases.extend((19.0, 0) for _ in range(4))
    assert sim._slot_wait_s(ahead) == expected


def test_the_simulated_slot_wait_is_none_while_a_slot_is_free():
    model = EngineModel(0.01, 0.001, 1e-4, 1e-8, token_budget=2048, kv_capacity_tokens=30_000)
    sim = Simulator(model, None, limit=7)
    sim.now, sim.running = 20.0, [waiter(0.0) for _ in range(6)]
    assert sim._slot_wait_s(0) == 0.0


def test_a_simulated_booked_retry_enters_past_a_full_limit_where_a_newcomer_is_refused():
    """As the server's admission (`retry:booked`): the limit full, a slot every 2.5 s,
    a 100-token request due in 0.2 s is refused; the booked retry is estimated with no
    slot wait and nobody waiting before it, and enters the engine at once."""
    model = EngineModel(0.01, 0.001, 1e-4, 1e-8, token_budget=2048, kv_capacity_tokens=30_000)
    sim = Simulator(model, P.PolicyConfig(), limit=6)
    sim.decisions = replace(sim.decisions, deadline_margin=1.0)
    sim.now = 20.0
    sim.running = [replace(waiter(0.0), first_token=1.0, started=True) for _ in range(6)]
    sim.releases.extend((19.0, 0) for _ in range(4))
    sim.lanes.push(waiter(19.9))  # a realtime waiter due before them both
    fresh = waiter(20.0, target=0.2)
    retry = replace(waiter(20.0, target=0.2), booked=True)
    for req in (fresh, retry):
        sim.arrive(req)
    sim._fill_slots()
    assert (fresh.status, fresh.actions) == ("rejected", ["refuse:deadline"])
    assert (retry.status, retry in sim.running, len(sim.lanes)) == ("ok", True, 1)


# Gamma(k)'s 90th percentile, k = 1..4 (scipy.stats.gamma.ppf(0.9, k)): the time to k
# releases of a Poisson stream at one per unit of time
GAMMA_P90 = {1: 2.302585, 2: 3.889720, 3: 5.322320, 4: 6.680783}


@pytest.mark.parametrize("ahead,over,releases,count", [
    (0, 0, 4, 1),  # its own release, at one every 2.5 s
    (2, 0, 4, 3),
    (0, 3, 4, 4),  # those over the limit leave first
    (1, -2, 5, 2),  # under the limit: nobody over it (the caller said no slot is free)
])
def test_the_shared_slot_wait_rule_is_the_waits_90th_percentile(ahead, over, releases, count):
    expected = GAMMA_P90[count] * RELEASE_WINDOW_S / releases
    assert slot_wait_s(ahead, over, releases) == pytest.approx(expected, rel=0.011)


def test_the_slot_wait_at_its_mean_is_one_release_gap_per_release_it_needs():
    # what the latency prediction starts from: 3 releases at one every 2.5 s
    assert slot_wait_s(2, 0, 4, p90=False) == 7.5
    assert slot_wait_s(0, 3, 4, p90=False) == 10.0


def test_the_slot_wait_is_infinite_when_nothing_was_released_lately():
    assert slot_wait_s(0, 0, 0) == float("inf")


def test_the_90th_percentile_approximation_stays_within_one_percent():
    assert [round(releases_p90(k), 4) for k in (1, 2, 3, 4, 20)] == \
        [2.2796, 3.8737, 5.3095, 6.6699, 25.8984]


@pytest.mark.parametrize("lane, deadline, expected", [
    (LANE_VIP, 100.25, 250),  # 250 ms after the epoch
    (LANE_VIP, 99.0, 0),  # due before the epoch: first in its lane, never negative
    (R.PRIORITY_REALTIME, 100.0, LANE_PRIORITY_STEP),
    (R.PRIORITY_BATCH, 100.5, 2 * LANE_PRIORITY_STEP + 500),
    (R.PRIORITY_REALTIME, 100.0 + 1e12, 2 * LANE_PRIORITY_STEP - 1),  # capped in its lane
])
def test_engine_priority_is_lane_then_deadline_in_ms(lane, deadline, expected):
    assert engine_priority(lane, deadline, epoch_s=100.0) == expected


def test_engine_priority_orders_a_short_vip_before_an_earlier_vip_document():
    document = engine_priority(LANE_VIP, 0.05 + 1.0, 0.0)  # came first, due in 1 s
    chat = engine_priority(LANE_VIP, 0.10 + 0.2, 0.0)  # came 50 ms later, due in 0.2 s
    realtime = engine_priority(R.PRIORITY_REALTIME, 0.0, 0.0)  # due at once
    assert sorted([realtime, document, chat]) == [chat, document, realtime]


@pytest.mark.parametrize("scheduling, deadlines_on, ahead", [
    (True, True, 200),  # the newcomer passes the waiting document due after it
    (True, False, 200 + 900),  # deadline check off: engine priorities all 0, arrival order
    (False, True, 200 + 900),  # vLLM's first-come order: nobody passes anybody
])
def test_the_simulated_work_ahead_skips_engine_prompts_the_newcomer_passes(
        scheduling, deadlines_on, ahead):
    """As the server's admission (`WorkAheadView._in_engine`): vLLM runs the prompts it
    has started, then its waiting queue by priority."""
    model = EngineModel(0.01, 0.001, 1e-4, 1e-8, token_budget=2048, kv_capacity_tokens=30_000)
    sim = Simulator(model, P.PolicyConfig(), priority_scheduling=scheduling)
    if deadlines_on:
        sim.decisions = replace(sim.decisions, deadline_margin=0.8)
    started = waiter(0.0, target=0.5, prompt=400)
    started.started, started.prefilled, started.context = True, 200, 400
    document = waiter(0.0, target=3.0, prompt=900)  # in the engine, not yet started
    for req in (started, document):
        req.engine_priority = sim._priority(req) or 0
        sim.running.append(req)
    chat = waiter(0.1, target=0.2, prompt=300)  # due at 0.3, before the document
    assert sim._work_ahead(chat).prefill_tokens == ahead


def test_the_simulated_kv_preemptable_is_what_the_next_victim_due_after_it_holds():
    from slo.sim import kv_cache

    due_late = waiter(0.0, prompt=800)
    due_late.started, due_late.prefilled, due_late.context, due_late.decoded = \
        True, 800, 800, 20
    due_late.engine_priority = 5000
    half = waiter(0.0, prompt=600)
    half.started, half.prefilled, half.context, half.engine_priority = True, 256, 600, 4000
    waiting = waiter(0.0, prompt=300)  # not started: holds no cache
    waiting.engine_priority = 9000
    due_early = waiter(0.0, prompt=500)
    due_early.started, due_early.prefilled, due_early.context = True, 500, 500
    due_early.engine_priority = 100
    running = [due_late, half, waiting, due_early]
    assert kv_cache.allocated(running) == 820 + 256 + 500
    assert kv_cache.preemptable(running, 1000) == 820  # the one due last, alone
    assert kv_cache.preemptable(running, 4500) == 820
    assert kv_cache.preemptable(running, 6000) == 0  # the victim is due before it
    assert kv_cache.preemptable(running, None) == 0
    twin = waiter(0.0, prompt=700)  # due with the victim, newer: preempted first
    twin.started, twin.prefilled, twin.context, twin.engine_priority = True, 700, 700, 5000
    assert kv_cache.preemptable(running + [twin], 1000) == 700


def test_the_simulated_engine_prefills_a_vip_prompt_first_and_uncapped():
    """As `serving.guard.vip_first` on vLLM's scheduler (tests/test_vip_first.py)."""
    model = EngineModel(0.01, 0.001, 1e-4, 1e-8, token_budget=2048, kv_capacity_tokens=30_000,
                        prefill_chunk_cap=256, prefill_cap_adaptive=True)
    sim = Simulator(model, P.PolicyConfig())
    sim.decisions = replace(sim.decisions, deadline_margin=1.0)
    docs = [waiter(0.0, target=1.5, prompt=3000) for _ in range(3)]
    vip = waiter(0.1, target=0.2, prompt=900, vip=True)
    for req in (*docs, vip):
        req.engine_priority = sim._priority(req)
        sim.running.append(req)
    for doc in docs:
        doc.started, doc.prefilled, doc.context = True, 256, 3000
    assert [(r is vip, take) for r, take in sim._chunks(2048, 20_000)] == [(True, 900)]
    vip.started, vip.prefilled, vip.context, vip.first_token = True, 900, 900, 0.15
    # its prompt done: the documents' chunks again, a fair share of four each
    assert [take for _, take in sim._chunks(2048, 20_000)] == [512, 512, 512]
    assert vips_first([*docs], 20_000) is None  # no VIP prompt: vLLM's own rule


@pytest.mark.parametrize("kv_free, expected", [(2000, ["v1", "v2"]), (1000, ["v1"]),
                                               (500, None)])
def test_waiting_vips_go_first_while_their_prompts_fit(kv_free, expected):
    reqs = {name: waiter(0.0, prompt=prompt) for name, prompt in
            (("doc", 2000), ("v1", 800), ("v2", 700), ("rt", 100))}
    reqs["doc"].started, reqs["doc"].engine_priority = True, LANE_PRIORITY_STEP + 9
    reqs["v1"].engine_priority, reqs["v2"].engine_priority = 5, 6
    reqs["rt"].engine_priority = LANE_PRIORITY_STEP + 1
    got = vips_first(list(reqs.values()), kv_free)
    assert (None if got is None else [k for k, r in reqs.items() if r in got]) == expected
    for r in reqs.values():
        r.engine_priority = 0  # the deadline check off: every priority 0
    assert vips_first(list(reqs.values()), kv_free) is None


def test_a_preempted_vip_needs_room_for_what_it_recomputes():
    doc, vip = waiter(0.0, prompt=2000), waiter(0.0, prompt=800)
    doc.started, doc.engine_priority = True, LANE_PRIORITY_STEP + 9
    vip.context, vip.engine_priority = 800 + 400, 5  # preempted after 400 tokens
    assert vips_first([doc, vip], 1000) is None  # its 800-token prompt alone would fit
    assert vips_first([doc, vip], 1200) == [vip]
