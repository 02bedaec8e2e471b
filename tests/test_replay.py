"""Replay / what-if: the engine model, the discrete-event simulator (with and without
the real policy engine), `slo.sim.replay` and the `replay` command, on hand-made models and
a synthetic trace log written with the real TraceLog. No server; every expected
number below is worked out by hand from the model's step cost.

Most simulator tests use one engine model (`model()`): a step costs
10 ms + 1 ms per scheduled token, 100 tokens a step, KV effectively unbounded. So a
100-token prefill chunk takes 0.11 s, one decode token alone 0.011 s.
"""

from __future__ import annotations

import dataclasses

import json

import numpy as np
import pytest
from click.testing import CliRunner

from observe.query import query_file
from observe import registry as R
from observe.tracelog import TraceLog
from slo.policy import conditions as P
from slo.sim import replay as rp
from slo.sim.engine_model import MIN_STEPS, EngineModel, attention_pairs, calibrate, fit_steps
from slo.sim.request import SimRequest
from slo.sim.simulation import LIMITER_MAX_WAIT_S, Simulator
from tailguard.cmd_replay import replay

CHUNK_S = 0.11  # a full 100-token prefill chunk, one sequence
DECODE_S = 0.011  # one decode token, one sequence


def model(**overrides) -> EngineModel:
    values = dict(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.001,
                  step_per_pair_s=0.0, token_budget=100, kv_capacity_tokens=10**9,
                  overhead_s=0.0)
    return EngineModel(**(values | overrides))


def run(requests: list[SimRequest], engine: EngineModel | None = None,
        config: P.PolicyConfig | None = None, limit: int | None = None) -> Simulator:
    sim = Simulator(engine or model(), config, limit=limit)
    sim.run(requests)
    return sim


# --- the simulator without policies --------------------------------------------------

def test_one_request_on_an_idle_engine_is_chunked_prefill_then_decode():
    r = SimRequest(arrival=0.0, prompt=250, output=3)
    run([r])
    # chunks of 100, 100 and 50 tokens: 0.11 + 0.11 + (0.01 + 0.05); the last chunk
    # samples token 1, then two decode steps of 0.011 each
    assert r.first_token == pytest.approx(0.28)
    assert r.ttft_s == pytest.approx(0.28)
    assert r.end == pytest.approx(0.302)
    assert (r.status, r.generated, r.actions) == ("ok", 3, [])
    assert r.good  # no target: served is good


def test_a_limit_of_one_serves_simultaneous_requests_one_after_another():
    first, second = SimRequest(0.0, 250, 3), SimRequest(0.0, 250, 3)
    run([first, second], limit=1)
    assert first.end == pytest.approx(0.302)
    assert second.admitted == pytest.approx(0.302)
    assert second.ttft_s == pytest.approx(0.302 + 0.28)  # first's end + its own prefill
    assert second.end == pytest.approx(0.302 + 0.302)


def test_continuous_batching_decodes_take_the_token_budget_first():
    a, b = SimRequest(0.0, 100, 3), SimRequest(0.0, 150, 1)
    run([a, b], limit=2)
    # step 1: a's whole prompt uses the budget (b waits): 0.11 s, a's first token
    assert a.first_token == pytest.approx(0.11)
    # step 2: a decodes (1 token), b gets the other 99: 0.01 + 0.100 -> 0.22
    # step 3: a decodes its last token, b the last 51: 0.01 + 0.052 -> 0.282
    assert b.first_token == pytest.approx(0.282)
    assert a.end == pytest.approx(0.282)
    assert b.end == pytest.approx(0.282)
    assert (a.generated, b.generated) == (3, 1)


def test_under_a_chunk_cap_a_short_prompt_is_prefilled_beside_a_document():
    """vLLM's long_prefill_token_threshold: while another request is in the engine each
    prompt gets at most `cap` tokens a step, so a short prompt behind a document does
    not wait for all of it; alone, a prompt takes the whole budget."""
    doc, short = SimRequest(0.0, 300, 1), SimRequest(0.0, 40, 1)
    run([doc, short], engine=model(prefill_chunk_cap=50))
    # step 1: doc 50 + short 40 (0.01 + 0.09); the short one's first token comes out
    assert short.first_token == pytest.approx(0.1)
    # then the doc alone: 250 tokens, whole budget: 100 + 100 + 50
    assert doc.first_token == pytest.approx(0.1 + 0.11 + 0.11 + 0.06)
    alone = SimRequest(0.0, 300, 1)
    run([alone], engine=model(prefill_chunk_cap=50))
    assert alone.first_token == pytest.approx(0.11 * 3)


def test_under_the_adaptive_cap_prompts_share_the_budget_at_least_fairly():
    """long_prefill_token_threshold_adaptive: the cap is never below the budget's fair
    share among the requests in the engine: two get 50 tokens a step each, not 20."""
    doc, short = SimRequest(0.0, 300, 1), SimRequest(0.0, 50, 1)
    run([doc, short], engine=model(prefill_chunk_cap=20, prefill_cap_adaptive=True))
    assert short.first_token == pytest.approx(0.01 + 0.1)  # doc 50 + short 50
    doc, short = SimRequest(0.0, 300, 1), SimRequest(0.0, 50, 1)
    run([doc, short], engine=model(prefill_chunk_cap=20))
    assert short.first_token == pytest.approx(2 * 0.05 + 0.04)  # 20 + 20 twice, 20 + 10


def test_a_prompt_waits_until_it_fits_the_kv_cache():
    a, b = SimRequest(0.0, 200, 2), SimRequest(0.0, 200, 1)
    run([a, b], engine=model(kv_capacity_tokens=300))
    # a: 2 chunks -> first token 0.22, one decode -> 0.231; b's 200 tokens do not fit
    # next to a's 201 (+1 decoding) in 300, so b starts only once a is gone
    assert a.first_token == pytest.approx(0.22)
    assert a.end == pytest.approx(0.231)
    assert b.first_token == pytest.approx(0.231 + 2 * CHUNK_S)
    assert b.end == b.first_token
    assert a.actions == b.actions == []


@pytest.mark.parametrize("prompt", [301, 10_000])
def test_a_prompt_larger_than_the_whole_kv_cache_is_rejected(prompt):
    too_big = SimRequest(0.0, prompt, 5)
    sim = run([too_big], engine=model(kv_capacity_tokens=300))  # returns: it terminated
    assert too_big.status == "rejected"
    assert too_big.actions == ["kv_cache_too_small"]
    assert too_big.first_token is None and too_big.end == 0.0
    assert sim.running == [] and not sim.lanes


def test_an_oversized_prompt_does_not_block_one_that_fits():
    too_big, fits = SimRequest(0.0, 400, 1), SimRequest(0.0, 100, 1)
    run([too_big, fits], engine=model(kv_capacity_tokens=300))
    assert (fits.status, fits.end) == ("ok", pytest.approx(CHUNK_S))
    assert too_big.status == "rejected" and too_big.actions == ["kv_cache_too_small"]
    assert too_big.end == 0.0  # refused at once, as vLLM refuses it up front


def test_a_prompt_waiting_for_kv_room_holds_back_those_behind_it():
    # vLLM starts waiting prompts in order, each only once all of it fits: the second
    # (250 tokens, 240 free) waits for the first to end, and the third (30 tokens),
    # which would fit the step and the cache, waits behind it
    first, second, third = (SimRequest(0.0, 60, 1), SimRequest(0.0, 250, 1),
                            SimRequest(0.0, 30, 1))
    run([first, second, third], engine=model(kv_capacity_tokens=300))
    assert first.end == pytest.approx(0.01 + 0.06)  # alone in its step
    assert second.first_token > first.end and third.first_token > first.end


@pytest.mark.parametrize("priority_scheduling", [True, False])
def test_with_priority_scheduling_a_short_vip_passes_a_vip_document_waiting_for_room(
        priority_scheduling):
    """As the server runs vLLM (tailguard's default): with the deadline policy on, the
    engine's waiting prompts go by lane, then deadline (from the first policy tick, at
    1 s). A VIP holder fills the cache; a VIP document (due at 3.3 s) waits for room; a
    short VIP prompt 10 ms later (due at 1.51 s) fits what is free and starts at once.
    In first-come order it waits behind the document until the holder ends."""
    holder = SimRequest(1.0, 200, 50, vip=True, target_s=5.0)
    document = SimRequest(1.3, 150, 1, vip=True, target_s=2.0)
    short = SimRequest(1.31, 20, 1, vip=True, target_s=0.2)
    sim = Simulator(model(kv_capacity_tokens=300), P.PolicyConfig(),
                    priority_scheduling=priority_scheduling)
    sim.run([holder, document, short])
    assert holder.end > 1.7  # 2 prefill chunks, then 49 decodes (some beside others)
    if priority_scheduling:
        assert short.first_token < 1.31 + 0.05 and short.good
        assert document.first_token > holder.end
    else:
        assert short.first_token > holder.end and not short.good


@pytest.mark.parametrize("keep", [True, False])
def test_a_later_due_document_waits_in_front_while_it_would_make_a_prompt_late(keep):
    """Admission's promise keeper in the simulator (deadline policy on from the first
    tick): a realtime prompt of 150 tokens due in 0.2 s takes a whole 100-token step
    alone (0.11 s), then its last 50 (0.06 s): on time at 0.17 s. A batch document
    that came during its first step would share the second (adaptive cap 50 each: 0.11
    s) and make it late (0.22 s); kept out, it enters after the prompt's first token."""
    prompt = SimRequest(1.0, 150, 1, target_s=0.2)
    doc = SimRequest(1.001, 300, 1, priority=R.PRIORITY_BATCH, target_s=5.0)
    sim = Simulator(model(prefill_chunk_cap=50, prefill_cap_adaptive=True),
                    P.PolicyConfig(keep_promises=keep))
    sim.run([prompt, doc])
    if keep:
        assert prompt.ttft_s == pytest.approx(0.17) and prompt.good
        assert doc.admitted == pytest.approx(1.17)
    else:
        assert prompt.ttft_s == pytest.approx(0.22) and not prompt.good
        assert doc.admitted == pytest.approx(1.11)


def test_a_document_late_even_alone_is_deferred_while_the_check_refuses_others():
    """While the deadline check refuses requests that could be on time (the
    predicted-miss policy active), one its target rules out even on an idle engine is
    refused (`refuse:unattainable`, not counted as the check's refusal); else it is
    served best effort in the batch lane."""
    sim = Simulator(model(), P.PolicyConfig())
    sim.decisions = dataclasses.replace(sim.decisions, deadline_margin=1.0, refusing_late=True)
    late = SimRequest(0.0, 300, 1, target_s=0.1)
    sim.arrive(late)
    assert (late.status, late.actions, sim.refused) == ("rejected", ["refuse:unattainable"], 0)
    sim.decisions = dataclasses.replace(sim.decisions, refusing_late=False)
    served = SimRequest(0.0, 300, 1, target_s=0.1)
    sim.arrive(served)
    assert (served.status, served.priority, served.actions) == (
        "ok", R.PRIORITY_BATCH, ["demote:unattainable"])


def test_kv_growth_preempts_the_newest_request_which_is_recomputed_later():
    a, b = SimRequest(0.0, 100, 50), SimRequest(0.0, 100, 50)
    run([a, b], engine=model(kv_capacity_tokens=210))
    # 0.11: a's prefill, first token. 0.22: a decodes, b prefills 99. 0.232: a decodes,
    # b's last token -> b's first token. 0.244, 0.256, 0.268: both decode (KV 206, 208,
    # 210). Then a=106+b=104 (+2 tokens) > 210: b, the newest, is preempted with
    # a 4-token generation; b's 104-token context cannot fit next to a, so a decodes
    # alone: its 7th..50th tokens at 0.268 + 44 * 0.011.
    assert a.first_token == pytest.approx(0.11)
    assert a.end == pytest.approx(0.268 + 44 * DECODE_S)
    assert a.actions == []
    assert b.actions == ["preempted"]
    # b recomputes prompt + 4 tokens (chunks of 100 and 4: 0.11 + 0.014) sampling its
    # 5th token, then decodes the other 45
    assert b.end == pytest.approx(a.end + 0.11 + 0.014 + 45 * DECODE_S)
    assert b.first_token == pytest.approx(0.232)  # the TTFT it had before preemption
    assert b.ttft_s == pytest.approx(0.232)
    assert (a.generated, b.generated) == (a.output, b.output) == (50, 50)
    assert a.status == b.status == "ok"


def test_overhead_delays_admission_and_counts_in_ttft():
    r = SimRequest(0.0, 250, 3)
    run([r], engine=model(overhead_s=0.5))
    assert r.admitted == pytest.approx(0.5)
    assert r.ttft_s == pytest.approx(0.5 + 0.28)
    assert r.end == pytest.approx(0.5 + 0.302)


def test_a_request_waiting_longer_than_the_limiter_allows_is_rejected():
    long = SimRequest(0.0, 100, 20_000)  # 0.11 + 19_999 * 0.011 = 220.099 s
    late = SimRequest(0.0, 100, 1)  # would wait 220 s > 120 s for the only slot
    fresh = SimRequest(150.0, 100, 1)  # waits 70 s: admitted
    run([long, late, fresh], limit=1)
    assert LIMITER_MAX_WAIT_S == 120.0
    assert long.end == pytest.approx(0.11 + 19_999 * DECODE_S)
    assert late.status == "rejected" and late.actions == ["admission_timeout"]
    assert late.end == pytest.approx(long.end) and late.first_token is None
    assert fresh.status == "ok"
    assert fresh.admitted == pytest.approx(long.end)
    assert fresh.first_token == pytest.approx(long.end + CHUNK_S)


# --- policies in simulated time -------------------------------------------------------

def test_token_cap_trips_on_queue_depth_and_caps_later_arrivals():
    config = P.PolicyConfig()
    _, timing = P.policy_table(config)[P.TOKEN_CAP]
    assert timing.trip_after_s == 0.0  # it trips at the first tick with a deep queue
    # 20 prompts of 1000 tokens at t=0: each prefill is 10 chunks (1.1 s) and they run
    # one after another (the first in line takes the whole budget), so at the t=1 tick
    # none has its first token: queue depth 4 waiting + 16 admitted = 20 > 5. The engine
    # was busy the whole second too (load 1.0 > 0.8), which trips truncation (also trip
    # time 0; it does not act here: short prompts). No targets: the deadline check
    # refuses nobody, so its policy stays inactive.
    burst = [SimRequest(0.0, 1000, 1, max_tokens=1000) for _ in range(config.queue_depth + 15)]
    capped = SimRequest(2.0, 10, 500, max_tokens=1000)
    small = SimRequest(2.0, 10, 50, max_tokens=100)
    no_limit = SimRequest(2.0, 10, 300)  # no max_tokens: capped as the server does
    sim = run(burst + [capped, small, no_limit], config=config)
    assert sim.transitions[0] == (1.0, "token_cap,truncation")
    assert all(r.actions == [] and r.output == 1 for r in burst)  # before the trip
    assert capped.actions == ["cap_max_tokens:256"]
    assert (capped.max_tokens, capped.output, capped.generated) == (256, 256, 256)
    assert small.actions == [] and small.generated == 50
    assert no_limit.actions == ["cap_max_tokens:256"] and no_limit.generated == 256
    assert all(r.status == "ok" for r in burst + [capped, small, no_limit])


def vip_only_scenario():
    """One request decoding for ~220 s keeps the engine busy every second (load = busy
    share over 10 s = 1.0 > load 0.8), from the t=1 tick on; vip_only trips after
    vip_only_for_s = 120 s of that: at t=121. No request finishes meanwhile, so the
    breaker (needs breaker_min_requests finished in its window) cannot trip first, and
    the queue stays empty (no token cap)."""
    config = P.PolicyConfig()
    assert P.policy_table(config)[P.VIP_ONLY][1].trip_after_s == config.vip_only_for_s
    long = SimRequest(0.0, 100, 20_000)
    before = SimRequest(60.0, 50, 1)
    after = SimRequest(125.0, 50, 1)
    vip = SimRequest(125.0, 50, 1, vip=True)
    return config, [long, before, after, vip], 1.0 + config.vip_only_for_s, (
        "vip_only,truncation")


def breaker_scenario():
    """Slow requests and nothing else: a 2 s overhead (outside the engine) puts every
    TTFT at 2 + 0.11 = 2.11 s while the engine stays nearly idle. Under the old
    breaker (TTFT P99 > 1.5 s for 30 s) this shed every non-VIP arrival from t=37;
    breaker L1 now trips on sickness only (off the engine model, 5xx, a stalled engine),
    which the simulator's engine, following its model exactly, never shows."""
    config = P.PolicyConfig()
    stream = [SimRequest(0.5 * i, 100, 1) for i in range(80)]  # t = 0 .. 39.5
    vips = [SimRequest(36.0, 100, 1, vip=True), SimRequest(38.0, 100, 1, vip=True)]
    requests = sorted(stream + vips, key=lambda r: r.arrival)
    return config, requests, None, None


@pytest.mark.parametrize("scenario, overhead_s, policy", [
    (vip_only_scenario, 0.0, P.VIP_ONLY),
])
def test_a_shedding_policy_sheds_non_vip_arrivals_after_it_trips(scenario, overhead_s, policy):
    config, requests, trip_at, active = scenario()
    sim = run(requests, engine=model(overhead_s=overhead_s), config=config)
    trips = [(t, names) for t, names in sim.transitions if policy in names.split(",")]
    assert trips[0] == (trip_at, active)
    entered = [r.arrival + overhead_s for r in requests]
    for r, at in zip(requests, entered):
        if at <= trip_at or r.vip:
            assert r.status == "ok", r
            assert r.generated == r.output
        else:
            assert r.status == "rejected", r
            assert r.actions == [f"shed:{policy}"]
            assert r.first_token is None and r.end >= trip_at
    assert sum(r.status == "rejected" for r in requests) > 0
    assert [r.status for r in requests if r.vip] == ["ok"] * sum(r.vip for r in requests)


def test_slow_requests_alone_never_trip_the_breaker():
    config, requests, _, _ = breaker_scenario()
    sim = run(requests, engine=model(overhead_s=2.0), config=config)
    assert not any(P.BREAKER_L1 in names.split(",") for _, names in sim.transitions)
    # the two VIPs arrive with a stream request (at 36 and 38): one of each pair waits
    # one chunk behind the other
    ttfts = sorted(round(r.ttft_s, 6) for r in requests)
    assert ttfts == [round(2.0 + CHUNK_S, 6)] * 80 + [round(2.0 + 2 * CHUNK_S, 6)] * 2
    assert all(r.status == "ok" and r.actions == [] for r in requests)


def test_vip_arrival_after_vip_only_trips_joins_the_running_batch():
    config, requests, _, _ = vip_only_scenario()
    run(requests, config=config)
    vip = requests[-1]
    # it enters within one decode step (0.011 s) and its 50-token prefill shares the
    # next step with the long request's decode: 0.01 + 0.051 s
    assert 0.061 <= vip.ttft_s <= DECODE_S + 0.061 + 1e-9
    assert requests[1].actions == []  # the one at t=60 is served untouched


@pytest.mark.parametrize("scenario, overhead_s", [
    (vip_only_scenario, 0.0), (breaker_scenario, 2.0)])
def test_without_a_config_nothing_is_ever_shed(scenario, overhead_s):
    _, requests, _, _ = scenario()
    sim = run(requests, engine=model(overhead_s=overhead_s), config=None)
    assert sim.policies is None and sim.transitions == []
    assert all(r.status == "ok" and r.actions == [] for r in requests)
    assert sim.decisions.concurrency_limit == P.PolicyConfig().batch_initial


# --- the engine model ----------------------------------------------------------------

def test_fit_steps_recovers_exact_coefficients_on_noise_free_data():
    rng = np.random.default_rng(7)
    seqs = rng.integers(1, 33, 300).astype(float)
    tokens = rng.integers(1, 2049, 300).astype(float)
    pairs = tokens * rng.integers(0, 4000, 300) + tokens * (tokens + 1) / 2
    truth = [0.004, 0.0003, 0.00002, 2e-9]
    duration = truth[0] + truth[1] * seqs + truth[2] * tokens + truth[3] * pairs
    coef, r2 = fit_steps(duration, seqs, tokens, pairs)
    assert coef == pytest.approx(truth, rel=1e-6)
    assert r2 == pytest.approx(1.0)


def test_fit_steps_clamps_a_negative_term_to_zero_and_refits_the_rest():
    # a full factorial grid: seqs 1..8 x tokens 100..1000, so seqs is uncorrelated with
    # tokens and their pairs. The truth has a negative per-seq cost (-1 ms): that term is
    # dropped and the intercept absorbs its mean, 0.01 - 0.001 * 4.5.
    seqs, tokens = (a.ravel().astype(float) for a in np.meshgrid(np.arange(1, 9),
                                                                   np.arange(100, 1001, 100)))
    duration = 0.01 - 0.001 * seqs + 0.0001 * tokens
    coef, r2 = fit_steps(duration, seqs, tokens, tokens * (tokens + 1) / 2)
    assert coef[1] == 0.0
    assert coef[[0, 2]] == pytest.approx([0.0055, 0.0001], rel=1e-9)
    assert abs(coef[3]) < 1e-15 and coef[3] >= 0
    assert (coef >= 0).all()
    # what is left unexplained is the per-seq part: var 1e-6 * 63/12 of
    # 1e-8 * 100^2 * 99/12 + that
    unexplained = 1e-6 * 63 / 12
    assert r2 == pytest.approx(1 - unexplained / (1e-8 * 1e4 * 99 / 12 + unexplained))


@pytest.mark.parametrize("field, value", [
    ("step_base_s", 0.0), ("step_base_s", -0.001), ("token_budget", 0),
    ("kv_capacity_tokens", 0), ("kv_capacity_tokens", -5)])
def test_engine_model_rejects_unusable_values(field, value):
    with pytest.raises(ValueError, match="not a usable engine model"):
        model(**{field: value})


def test_step_cost_is_the_fitted_formula():
    m = EngineModel(0.004, 0.0003, 0.00002, 2e-9, token_budget=512, kv_capacity_tokens=840)
    assert m.step_s(3, 200, 40_000) == pytest.approx(0.004 + 0.0009 + 0.004 + 0.00008)
    # n steps at once: the model is linear, so the sum of their step costs
    assert m.steps_s(4, 3, 800, 160_000) == pytest.approx(4 * m.step_s(3, 200, 40_000))
    assert m.describe()["token_budget"] == 512


def test_attention_pairs_of_a_prompt_do_not_depend_on_its_chunks():
    assert attention_pairs(0, 1) == 1 and attention_pairs(0, 4) == 1 + 2 + 3 + 4
    assert attention_pairs(1000, 1) == 1001  # a decode over 1,000 tokens of context
    whole = attention_pairs(0, 3000)
    assert attention_pairs(0, 2048) + attention_pairs(2048, 952) == whole
    assert attention_pairs(2048, 952) > 2 * attention_pairs(0, 952)  # the dear last chunk


# --- a synthetic trace log -------------------------------------------------------------

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
COEF = (0.004, 0.0003, 0.00002, 2e-9)  # base, per seq, per token, per attention pair
BUDGET = 512
STEPS = 240
SERVED = 30  # ok requests, one every 2 s: t = 0 .. 58
MISSED = (5, 20)  # of those, these have TTFT 1.5 s against a 1.0 s target
OVERHEADS = (0.01, 0.02, 0.03)  # ttft - prefill, 10 requests each: median 0.02
PROMPT, OUTPUT, MAX_TOKENS = 200, 20, 64
KV_USAGE = 0.25  # at t+1 of the first 12 requests: 200 + 20 * 0.5 tokens / 0.25 = 840


def step_s(seqs: int, tokens: int, pairs: int) -> float:
    a, b, c, d = COEF
    return a + b * seqs + c * tokens + d * pairs


def write_trace(path, steps: int = STEPS) -> None:
    rng = np.random.default_rng(3)
    with TraceLog(path) as log:
        for i in range(steps):
            seqs = int(rng.integers(1, 33))
            tokens = BUDGET if i == 0 else int(rng.integers(1, BUDGET))
            pairs = attention_pairs(int(rng.integers(0, 3000)), tokens)
            attributes = {"tailguard.step.batch_size": seqs,
                          "tailguard.step.scheduled_tokens": tokens,
                          "tailguard.step.attention_pairs": pairs}
            if i % 10 == 1:  # recorded before the probe counted pairs: read as fresh
                del attributes["tailguard.step.attention_pairs"]
                pairs = attention_pairs(0, tokens)
            log.add("spans", {
                "trace_id": f"t{i}", "span_id": f"s{i}", "name": "llm.step",
                "start_ts": T0 + i * 0.05, "end_ts": T0 + i * 0.05 + step_s(seqs, tokens, pairs),
                "duration_s": step_s(seqs, tokens, pairs), "attributes": attributes})
        # neither another span kind nor a step without a duration is fitted
        log.add("spans", {"name": "llm.request", "duration_s": 9.0, "attributes": {
            "tailguard.step.batch_size": 1, "tailguard.step.scheduled_tokens": 5000}})
        log.add("spans", {"name": "llm.step", "duration_s": None, "attributes": {
            "tailguard.step.batch_size": 1, "tailguard.step.scheduled_tokens": 5000}})
        for i in range(SERVED):
            ttft = 1.5 if i in MISSED else 0.5
            log.add("requests", {
                "request_id": f"r{i}", "arrival_ts": T0 + 2 * i, "priority": "realtime",
                "status": "ok", "http_status": 200, "prompt_tokens": PROMPT,
                "output_tokens": OUTPUT, "max_tokens": MAX_TOKENS, "ttft_s": ttft,
                "prefill_s": ttft - OVERHEADS[i % 3], "tokenize_s": 0.0, "queue_s": 0.0,
                "e2e_s": 2.0, "slo_ttft_target_s": 1.0, "policy_actions": [],
                "running_requests": 0, "pending_requests": 0, "vip": False})
            if i < 12:
                log.add("engine_stats", {"ts": T0 + 2 * i + 1, "kv_cache_usage": KV_USAGE})
        # shed by a policy: replayed (and counted as shed); a client error: not replayed
        log.add("requests", {
            "request_id": "shed", "arrival_ts": T0 + 31, "priority": "realtime",
            "status": "rejected", "http_status": 503, "error_type": "overloaded",
            "prompt_tokens": 150, "output_tokens": 0, "max_tokens": 10,
            "slo_ttft_target_s": 1.0, "policy_actions": ["shed:vip_only"], "vip": False})
        log.add("requests", {
            "request_id": "bad", "arrival_ts": T0 + 100, "status": "rejected",
            "http_status": 400, "error_type": "invalid_request", "prompt_tokens": 100,
            "output_tokens": 0, "policy_actions": []})


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("replay") / "trace.duckdb")
    write_trace(path)
    return path


def file_query(path: str):
    def query(sql: str):
        result = query_file(path, sql, max_rows=1_000_000, timeout_s=60)
        return result.columns, result.rows
    return query


@pytest.fixture(scope="module")
def calibrated(trace) -> EngineModel:
    return calibrate(file_query(trace))


@pytest.fixture(scope="module")
def recorded(trace) -> rp.Recorded:
    return rp.load_recorded(file_query(trace))


def test_calibrate_fits_the_recorded_steps(calibrated):
    m = calibrated
    assert (m.step_base_s, m.step_per_seq_s, m.step_per_token_s,
            m.step_per_pair_s) == pytest.approx(COEF, rel=1e-6)
    assert m.fit_r2 == pytest.approx(1.0)
    assert m.steps_fitted == STEPS
    assert m.token_budget == BUDGET  # the most any step scheduled
    assert m.overhead_s == pytest.approx(0.02)  # median of ttft - prefill
    assert m.kv_capacity_tokens == 840


@pytest.mark.parametrize("steps", [0, MIN_STEPS - 1])
def test_calibrate_refuses_too_few_steps(tmp_path, steps):
    path = str(tmp_path / "few.duckdb")
    write_trace(path, steps=steps)
    with pytest.raises(ValueError, match=f"holds {steps} engine steps; calibrating needs at "
                                         f"least {MIN_STEPS}"):
        calibrate(file_query(path))


# --- replay ----------------------------------------------------------------------------

def test_load_recorded_keeps_policy_sheds_and_drops_client_errors(recorded):
    ids = [r["t"] for r in recorded.requests]
    assert len(recorded.requests) == SERVED + 1  # the 400 is not an arrival
    assert ids == sorted(ids) and ids[0] == 0.0
    assert recorded.duration_s == 58.0  # the last arrival, not the 400 at t=100
    shed = [r for r in recorded.requests if r["shed"]]
    assert [(r["t"], r["prompt_tokens"]) for r in shed] == [(31.0, 150)]
    arrivals = recorded.arrivals()
    shed_arrival = next(a for a in arrivals if a.arrival == 31.0)
    # it never generated: the served median (20) within its max_tokens (10)
    assert (shed_arrival.prompt, shed_arrival.output, shed_arrival.vip) == (150, 10, False)
    assert all((a.prompt, a.output, a.max_tokens, a.target_s) == (200, 20, 64, 1.0)
               for a in arrivals if a is not shed_arrival)


def test_actual_counts_the_policy_shed_and_the_missed_targets(recorded):
    actual = recorded.actual()
    good = SERVED - len(MISSED)
    assert actual == rp.Outcome(requests=31, attainment=pytest.approx(good / 31),
                                goodput_rps=pytest.approx(good / 58),
                                shed_rate=pytest.approx(1 / 31), ttft_p50_s=0.5,
                                ttft_p99_s=pytest.approx(1.5))


def test_validate_reports_simulated_minus_actual(calibrated, recorded):
    result = rp.validate(calibrated, P.PolicyConfig(), recorded)
    actual, simulated = result["actual"], result["simulated"]
    assert actual == recorded.actual().as_dict()
    # one request at a time, light load: every one is served within its target, TTFT =
    # overhead + one 200-token chunk (a 150-token one for the formerly shed request)
    ttft = 0.02 + step_s(1, PROMPT, attention_pairs(0, PROMPT))
    assert simulated["requests"] == 31
    assert simulated["attainment"] == 1.0 and simulated["shed_rate"] == 0.0
    assert simulated["goodput_rps"] == pytest.approx(31 / 58)
    assert simulated["ttft_p50_s"] == pytest.approx(ttft)
    assert simulated["ttft_p99_s"] == pytest.approx(ttft)
    assert result["error"]["attainment"] == pytest.approx(1 - 28 / 31)
    assert result["error"] == {k: pytest.approx(simulated[k] - actual[k])
                               for k in result["error"]}
    assert set(result["error"]) == {"attainment", "goodput_rps", "shed_rate", "ttft_p50_s",
                                    "ttft_p99_s"}


def test_compare_runs_baseline_and_candidate_on_the_same_arrivals(calibrated, recorded):
    # The candidate calls any engine activity overload and sheds at once. The request
    # at t=0 keeps the engine busy in the first second, so vip_only trips at the t=1
    # tick; with everyone shed, that busy sample leaves the 10 s load window at t=12:
    # vip_only recovers (held 11 >= 10 s) and stops shedding, the request at t=12 is
    # served, its busy second relapses the policy at t=13. So every 12 s one gets
    # through: t = 0, 12, 24, 36, 48 (5 of 31), and vip_only moves 9 times
    # (on at 1, 13, 25, 37, 49; off at 12, 24, 36, 48).
    candidate = P.PolicyConfig(load=0.0, load_clear=0.0, vip_only_for_s=0.0)
    result = rp.compare(calibrated, P.PolicyConfig(), candidate, recorded)
    assert result["actual"] == recorded.actual().as_dict()
    assert result["baseline"] == rp.validate(calibrated, P.PolicyConfig(),
                                             recorded)["simulated"]
    assert result["baseline"]["shed_rate"] == 0.0
    cand = result["candidate"]
    assert cand["requests"] == 31
    assert cand["shed_rate"] == pytest.approx(26 / 31)
    assert cand["attainment"] == pytest.approx(5 / 31)
    assert cand["goodput_rps"] == pytest.approx(5 / 58)
    assert cand["ttft_p99_s"] == pytest.approx(0.02 + step_s(1, PROMPT, attention_pairs(0, PROMPT)))
    assert result["candidate_transitions"] == 9
    _, sim = rp.simulate(calibrated, candidate, recorded.arrivals(), recorded.duration_s)
    assert [t for t, _ in sim.transitions] == [1.0, 12.0, 13.0, 24.0, 25.0, 36.0, 37.0,
                                               48.0, 49.0]


def test_scaled_arrivals_copies_and_slices_deterministically(recorded):
    n = len(recorded.requests)
    doubled = rp.scaled_arrivals(recorded, 2, 1)
    assert len(doubled) == 2 * n
    assert [r.arrival for r in doubled] == sorted(r.arrival for r in doubled)
    assert sorted(r.prompt for r in doubled) == sorted(2 * [r.prompt for r in
                                                            recorded.arrivals()])
    sliced = rp.scaled_arrivals(recorded, 10, 10, seed=4)
    assert len(sliced) == n  # 10 n copies, every 10th
    again = rp.scaled_arrivals(recorded, 10, 10, seed=4)
    assert [(r.arrival, r.prompt) for r in again] == [(r.arrival, r.prompt) for r in sliced]
    other = rp.scaled_arrivals(recorded, 10, 10, seed=5)
    assert [r.arrival for r in other] != [r.arrival for r in sliced]
    # a fractional load keeps about that share of the extra copies
    assert n <= len(rp.scaled_arrivals(recorded, 1.5, 1)) <= 2 * n
    # jitter stays within a second of the recorded arrival
    originals = sorted(r.arrival for r in recorded.arrivals())
    assert all(any(0 <= r.arrival - t < 1 for t in originals) for r in doubled)


def test_scale_reports_fleet_goodput(calibrated, recorded):
    rows = rp.scale(calibrated, P.PolicyConfig(), recorded, 2, [1, 2])
    assert [(r["load"], r["replicas"]) for r in rows] == [(2, 1), (2, 2)]
    for r in rows:
        assert r["fleet_goodput_rps"] == pytest.approx(r["goodput_rps"] * r["replicas"])
    assert rows[0]["requests"] == 2 * 31 and rows[1]["requests"] == 31


def test_a_row_without_policy_actions_counts_as_not_shed(tmp_path):
    path = str(tmp_path / "old.duckdb")
    with TraceLog(path) as log:
        log.add("requests", {"arrival_ts": T0, "status": "ok", "http_status": 200,
                             "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.1})
    recorded = rp.load_recorded(file_query(path))
    assert recorded.actual().shed_rate == 0.0
    assert not recorded.requests[0]["shed"]


# --- the command -----------------------------------------------------------------------

def invoke(*args: str):
    return CliRunner().invoke(replay, list(args))


def test_cli_validates_by_default(trace):
    result = invoke("--db", trace)
    assert result.exit_code == 0, result.output
    assert f"engine model (calibrated on {trace}): step = 4.00 ms + 300 us/seq + 20.0 us/token" \
        " + 2.0 ns/attention pair" in result.output
    assert f"budget {BUDGET} tokens/step, KV 840 tokens, overhead 20.0 ms" in result.output
    assert "simulated - actual: attainment +9.68 pts" in result.output
    header = result.output.splitlines()[1].split()
    assert header == ["actual", "simulated"]


def test_cli_json(trace):
    result = invoke("--db", trace, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"model", "actual", "simulated", "error"}
    assert data["model"]["token_budget"] == BUDGET
    assert data["actual"]["requests"] == 31
    assert data["error"]["attainment"] == pytest.approx(
        data["simulated"]["attainment"] - data["actual"]["attainment"])


def test_cli_models_the_engines_chunk_cap_as_told(trace):
    """The log does not say how the engine capped prefill chunks: tailguard serve's
    default (256, adaptive) unless the operator says otherwise."""
    def model(*args: str) -> dict:
        out = invoke("--db", trace, "--format", "json", *args)
        assert out.exit_code == 0, out.output
        return json.loads(out.output)["model"]

    shown = [(m["prefill_chunk_cap"], m["prefill_cap_adaptive"]) for m in (
        model(), model("--chunk-cap", "0"), model("--chunk-cap", "128", "--fixed-cap"))]
    assert shown == [(256, True), (0, False), (128, False)]


def test_cli_compares_with_a_policies_file(trace, tmp_path):
    policies = tmp_path / "stricter.yaml"
    policies.write_text("queue_depth: 3\n")
    result = invoke("--db", trace, "--policies", str(policies))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split() == ["actual", "baseline", "candidate"]
    assert lines[2].split() == ["requests", "31", "31", "31"]
    assert "simulated - actual" not in result.output


def test_cli_capacity_mode(trace):
    result = invoke("--db", trace, "--load", "2", "--replicas", "1,2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split() == ["load", "replicas", "attainment", "shed", "ttft", "p99", "s",
                                "fleet", "goodput/s"]
    rows = [line.split() for line in lines[2:]]
    assert [row[:2] for row in rows] == [["2x", "1"], ["2x", "2"]]


def test_cli_calibrates_on_another_recording(trace, tmp_path):
    """Out of sample: the engine model comes from --calibrate-from, the arrivals and
    the actual outcome from --db."""
    other = str(tmp_path / "other.duckdb")
    write_trace(other, steps=MIN_STEPS)
    with TraceLog(other) as log:  # plus one very slow step: a different fit
        log.add("spans", {"name": "llm.step", "duration_s": 5.0, "attributes": {
            "tailguard.step.batch_size": 1, "tailguard.step.scheduled_tokens": 1}})
    own = json.loads(invoke("--db", trace, "--format", "json").output)
    out = invoke("--db", trace, "--calibrate-from", other, "--format", "json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["model"]["calibrated_on"] == other and own["model"]["calibrated_on"] == trace
    assert data["model"]["steps_fitted"] == MIN_STEPS + 1 != own["model"]["steps_fitted"]
    assert data["actual"] == own["actual"]  # same recorded run judged
    assert data["simulated"] != own["simulated"]


@pytest.mark.parametrize("args, message", [
    (["--db", "{trace}", "--calibrate-from", "{tmp}/missing.duckdb"],
     "no trace log at {tmp}/missing.duckdb"),
    (["--db", "{tmp}/missing.duckdb"], "no trace log at {tmp}/missing.duckdb"),
    (["--db", "{trace}", "--replicas", "0"], "replica counts are positive integers"),
    (["--db", "{trace}", "--replicas", "1,x"], "'1,x' is not a comma-separated list"),
    (["--db", "{trace}", "--load", "abc"], "'abc' is not a comma-separated list of numbers"),
    (["--db", "{trace}", "--load", "0"], "load factors are positive"),
    (["--db", "{trace}", "--chunk-cap", "-1"], "-1 is not in the range x>=0"),
    (["--db", "{trace}", "--policies", "{tmp}/typo.yaml"],
     "unknown field(s) queue_dept"),
    (["--db", "{trace}", "--baseline", "{tmp}/bad.yaml"],
     "queue_depth_clear must not exceed queue_depth"),
    (["--db", "{tmp}/few.duckdb"], "calibrating needs at least 200"),
])
def test_cli_bad_input_is_a_usage_error(trace, tmp_path, args, message):
    (tmp_path / "typo.yaml").write_text("queue_dept: 3\n")
    (tmp_path / "bad.yaml").write_text("queue_depth: 1\n")
    if "{tmp}/few.duckdb" in args:
        write_trace(str(tmp_path / "few.duckdb"), steps=10)
    fill = {"tmp": str(tmp_path), "trace": trace}
    result = invoke(*(a.format(**fill) for a in args))
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and message.format(**fill) in error[0], result.output
