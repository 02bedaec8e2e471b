"""Admission without an engine: the limiter's lanes and limits, and each per-request
decision (cap, shed, truncation, the deadline check) on a real record with the real
predictor service (seed formula)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from observe import registry as R
from observe.record import RequestRecord
from observe.stats import StepRecord
from serving.admission import Admission
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker, PrefillEnd
from serving.engine.stats import EngineSecond
from serving.errors import from_refusal
from serving.guard.live_predictor import PredictionService
from serving.guard.verdicts import Refusal
from serving.limiter import Limiter, LimiterTimeout
from slo.policy import feasibility as F
from slo.policy.decisions import Decisions
from slo.policy.playout import Prompt
from slo.sim.engine_model import attention_pairs
from slo.sim.lanes import LANE_PRIORITY_STEP, LANE_VIP, LANES, engine_priority, releases_p90


def _admission(decisions: Decisions, target_s: float = 0.5, limit: int = 8) -> Admission:
    service = PredictionService(None, None, retrain_interval_s=0)  # the seed formula
    adm = Admission(LoadTracker(EngineSecond()), service, Limiter(limit), FaultInjector(),
                    lambda tokens: target_s)
    adm.publish(decisions)
    return adm


def _record(priority: str = R.PRIORITY_REALTIME, vip: bool = False) -> RequestRecord:
    rec = RequestRecord("r", 0.0, "text_completion", priority=priority)
    rec.vip = vip
    return rec


def _prompt(tokens: int) -> dict:
    return {"prompt_token_ids": list(range(tokens))}


@pytest.mark.parametrize("asked,cap,expected,action", [
    (400, 256, 256, ["cap_max_tokens:256"]),
    (None, 256, 256, ["cap_max_tokens:256"]),
    (100, 256, 100, []),
    (400, None, 400, []),
])
def test_the_max_tokens_cap(asked, cap, expected, action):
    adm = _admission(Decisions(8, max_tokens_cap=cap))
    rec, request = _record(), SimpleNamespace(max_tokens=asked)
    assert adm.check_http(rec, request) is None
    assert request.max_tokens == expected and rec.policy_actions == action


@pytest.mark.parametrize("shed,vip,refused", [
    ("breaker_l1", False, True), ("breaker_l1", True, False),
    ("vip_only", False, True), ("vip_only", True, False), (None, False, False)])
def test_shedding_spares_vip(shed, vip, refused):
    adm = _admission(Decisions(8, shed_non_vip=shed, retry_after_s=7))
    rec = _record(vip=vip)
    refusal = adm.check_http(rec, SimpleNamespace(max_tokens=4))
    if not refused:
        assert refusal is None and rec.policy_actions == []
        return
    err = from_refusal(refusal)
    assert err.status == 503 and err.headers == {"Retry-After": "7"}
    assert err.outcome == R.STATUS_REJECTED
    assert rec.policy_actions == [f"shed:{shed}"]


def test_a_restarting_engine_refuses_everyone_even_vip():
    adm = _admission(Decisions(8, restarting=True))
    refusal = adm.check_http(_record(vip=True), SimpleNamespace(max_tokens=4))
    assert from_refusal(refusal).error_type == "engine_restarting"


def test_truncation_keeps_the_first_tokens():
    adm = _admission(Decisions(8, truncate_tokens=100))
    rec = _record()
    admitted = asyncio.run(adm.admit(rec, _prompt(150), 150, 4))
    prompt, tokens = admitted.prompt, admitted.prompt_tokens
    assert prompt["prompt_token_ids"] == list(range(100)) and tokens == 100
    assert rec.policy_actions == ["truncate:150->100"]
    assert rec.prediction.version == "engine-queue" and rec.load.pending_requests == 0


DEADLINE = dict(deadline_margin=0.8, deadline_truncate_tokens=4096)
RT = LANE_PRIORITY_STEP  # the realtime lane's engine priorities start here (VIPs' below)


def _queue(adm: Admission, tokens: int) -> None:
    """Prompt tokens admitted into the engine with no first token yet (work ahead)."""
    adm.load.admit(tokens)


def _ahead(model, queued: int) -> F.WorkAhead:
    """`queued` prompt tokens the load tracker counts in the engine but no prompt there
    accounts for (`_queue`): one fresh prompt ahead, no step in progress (the engine
    holds none of it)."""
    return F.WorkAhead(queued, 0, 0.0, 0.0, attention_pairs(0, queued), int(queued > 0),
                       kv_free_tokens=model.kv_capacity_tokens,
                       queue=(Prompt(queued, 0, 0, False),) if queued else ())


def test_the_check_counts_the_slot_wait_at_its_90th_percentile_and_the_prediction_at_its_mean():
    """Slots full, one release every 2.5 s lately: the deadline check waits 2.28x the
    gap for its own release (`releases_p90(1)`), and refuses a request due in 3 s; the
    latency prediction's input (`ttft_expected_s`) counts the mean gap."""
    adm = _admission(Decisions(2, **DEADLINE), target_s=3.0, limit=2)
    adm.limiter.in_flight = 6
    for _ in range(4):
        adm.limiter.release(None)  # four releases over the 10 s window; two in flight
    rec = _record()
    rec.arrival = time.monotonic()
    assert isinstance(asyncio.run(adm.admit(rec, _prompt(10), 10, 4)), Refusal)
    assert rec.ttft_estimate_s - rec.ttft_expected_s == pytest.approx(
        (releases_p90(1) - 1) * 2.5, abs=1e-3)


@pytest.mark.parametrize("queued,sample", [(0, True), (5000, False)])
def test_a_request_judged_with_nothing_ahead_is_a_sample_of_the_overhead(queued, sample):
    """Its TTFT less the estimate's engine part is what a request spends after the check
    outside the steps (`LiveEngineModel.on_request`): kept only when no prompt was
    ahead of it, so the sample holds no error of the queue's estimate."""
    adm = _admission(Decisions(8, **DEADLINE), 5.0)
    _queue(adm, queued)
    rec = _record()
    rec.arrival = time.monotonic()
    asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    overhead = adm.engine_model.model.overhead_s
    assert rec.engine_ttft_s == (pytest.approx(rec.ttft_expected_s - overhead) if sample
                                 else None)


@pytest.mark.parametrize("priority,vip,queued,target_s,outcome", [
    # an empty engine: the prior model says ~25 ms for 10 tokens -> admitted
    (R.PRIORITY_REALTIME, False, 0, 0.5, None),
    (R.PRIORITY_BATCH, False, 0, 0.5, None),
    # 200,000 prompt tokens ahead (tens of seconds of prefill) -> refused now
    (R.PRIORITY_REALTIME, False, 200_000, 0.5, "refuse:deadline"),
    (R.PRIORITY_BATCH, False, 200_000, 0.5, "refuse:deadline"),
    # VIP is never refused for load
    (R.PRIORITY_REALTIME, True, 200_000, 0.5, None),
])
def test_the_deadline_check_refuses_at_once_with_429_and_the_drain_time(
        priority, vip, queued, target_s, outcome):
    adm = _admission(Decisions(8, **DEADLINE), target_s)
    adm.engine_model.set_engine_limits(2048, kv_capacity_tokens=1_000_000)  # room for all
    _queue(adm, queued)
    rec = _record(priority, vip)
    rec.arrival = time.monotonic()
    verdict = asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    assert rec.policy_actions == ([outcome] if outcome else [])
    model = adm.engine_model.model
    if outcome is None:
        assert not isinstance(verdict, Refusal)
        # a VIP's prompt is prefilled first (`serving.guard.vip_first`): the tokens
        # queued are not ahead of it
        assert rec.ttft_estimate_s == pytest.approx(
            F.first_token_s(model, 10, replace(_ahead(model, queued), own_vip=vip)), abs=0.01)
        return
    err = from_refusal(verdict)
    drain = F.drain_s(model, _ahead(model, queued))
    assert err.status == 429 and err.error_type == "deadline"
    assert err.headers == {"Retry-After": str(min(120, math.ceil(drain)))}
    assert adm.load.pending == (1, queued)  # its own tokens left with it
    assert adm.refused_deadline == 1


def test_a_prompt_that_must_wait_for_kv_room_is_refused_until_there_is_room():
    adm = _admission(Decisions(8, **DEADLINE), target_s=0.5)
    adm.engine_model.set_engine_limits(2048, kv_capacity_tokens=10_000)
    adm.load._second.on_scheduler(4, 0, 0.99)  # 100 tokens of the KV cache free
    adm.limiter.in_flight = 1
    adm.limiter.release(None, kv_tokens=2000)  # requests ending free 200 tokens a second
    rec = _record()
    rec.arrival = time.monotonic()
    verdict = asyncio.run(adm.admit(rec, _prompt(400), 400, 4))
    # 300 tokens short: the one release lately freed 2,000, so one more frees them; its
    # 90th percentile at one release in 10 s: 22.8 s (1.5 s at the mean token rate)
    err = from_refusal(verdict)
    assert err.status == 429 and err.headers == {"Retry-After": "23"}
    assert rec.policy_actions == ["refuse:deadline"]
    fits = _record()
    fits.arrival = time.monotonic()
    assert not isinstance(asyncio.run(adm.admit(fits, _prompt(90), 90, 4)), Refusal)


def test_refused_requests_are_booked_one_after_another_and_their_retry_claims_it():
    """A burst refused for the same queue is told to come back at spaced times; until
    then their prompts are work ahead of newcomers; the retry itself does not count
    its own booking."""
    adm = _admission(Decisions(8, **DEADLINE), 0.5)
    _queue(adm, 20_000)
    model, verdicts = adm.engine_model.model, []
    for client in ("a", "b"):
        rec = _record()
        rec.arrival, rec.client = time.monotonic(), client
        verdicts.append(asyncio.run(adm.admit(rec, _prompt(100), 100, 4)))
    drain = F.drain_s(model, _ahead(model, 20_000))
    own = F.prefill_s(model, 100, 0)
    first = math.ceil(drain)
    assert [v.retry_after_s for v in verdicts] == [first, math.ceil(first + own)]
    assert len(adm.retries) == 2
    adm.load.release(20_000)  # the queue drained; "a" comes back at its time
    now = time.monotonic() + first
    assert adm.retries.work_due(now, now + 0.5) == (200, 2 * attention_pairs(0, 100))  # both
    assert adm.retries.claim("a", 100, now) and len(adm.retries) == 1


@pytest.mark.parametrize("hold, client, counted", [
    (False, "c", False),  # bookings only space the Retry-After times
    (True, "c", True),  # held: a newcomer due after a booking's start waits for it
    (True, "a", False),  # the retry that claims the booking does not wait for itself
])
def test_held_bookings_are_work_ahead_of_newcomers(hold, client, counted):
    adm = _admission(Decisions(8, **DEADLINE, hold_retries=hold), 0.5)
    now = time.monotonic()
    assert adm.retries.book("a", 100, now - 1.0, 0.0, 0.05) == 1  # back about now
    rec = _record()
    rec.arrival, rec.client = now, client
    verdict = asyncio.run(adm.admit(rec, _prompt(100), 100, 4))
    assert not isinstance(verdict, Refusal)
    model = adm.engine_model.model
    alone = F.first_token_s(model, 100, F.WorkAhead(0, 0))
    with_booking = F.first_token_s(model, 100, F.WorkAhead(100, 0))
    assert rec.ttft_estimate_s == pytest.approx(with_booking if counted else alone,
                                                abs=0.005)
    assert len(adm.retries) == (0 if client == "a" and hold else 1)


def test_with_the_deadline_policy_forced_off_nothing_is_refused_for_lateness():
    adm = _admission(Decisions(8), 0.5)  # deadline_margin None: forced off
    _queue(adm, 200_000)
    rec = _record()
    rec.arrival = time.monotonic()
    verdict = asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    assert not isinstance(verdict, Refusal) and rec.policy_actions == []
    assert rec.ttft_estimate_s > 10  # the estimate is still made (breaker, prediction)
    assert rec.prediction.version == "engine-queue"


@pytest.mark.parametrize("decisions, vip, priority, expected_lane", [
    (Decisions(8, **DEADLINE), True, R.PRIORITY_REALTIME, LANE_VIP),
    (Decisions(8, **DEADLINE), False, R.PRIORITY_REALTIME, R.PRIORITY_REALTIME),
    (Decisions(8, **DEADLINE), False, R.PRIORITY_BATCH, R.PRIORITY_BATCH),
    (Decisions(8), True, R.PRIORITY_REALTIME, None),  # deadline policy off: arrival order
])
def test_the_engine_priority_is_the_lane_then_the_deadline(decisions, vip, priority,
                                                           expected_lane):
    adm = _admission(decisions, target_s=0.2)
    rec = _record(priority, vip=vip)
    rec.arrival = adm.epoch + 1.5  # due 1.7 s after admission began counting
    verdict = asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    expected = 0 if expected_lane is None else \
        LANES.index(expected_lane) * LANE_PRIORITY_STEP + 1700
    assert verdict.priority == expected


def test_work_ahead_counts_the_engine_and_the_lanes_up_to_its_own():
    async def scenario():
        adm = _admission(Decisions(1, **DEADLINE), 0.5, limit=1)
        adm.engine_model.last_step_end = time.monotonic() - 1.0  # idle for a second
        await adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=300)  # one holds the slot
        adm.load.admit(300)  # ... and waits for its first token, in no step yet
        waiters = [asyncio.create_task(adm.limiter.acquire(lane, tokens=tokens))
                   for lane, tokens in (("vip", 50), (R.PRIORITY_REALTIME, 700),
                                        (R.PRIORITY_BATCH, 9000))]
        for (_, tokens) in (("vip", 50), ("rt", 700), ("batch", 9000)):
            adm.load.admit(tokens)
        await asyncio.sleep(0.01)
        load = adm.load.admit(0)
        now = time.monotonic()
        out = {lane: adm.work_ahead(lane, load, now).prefill_tokens
               for lane in ("vip", R.PRIORITY_REALTIME, R.PRIORITY_BATCH)}
        for w in waiters:
            w.cancel()
        return out

    assert asyncio.run(scenario()) == {"vip": 350, R.PRIORITY_REALTIME: 1050,
                                       R.PRIORITY_BATCH: 10_050}


@pytest.mark.parametrize("newcomer, passed", [
    # vLLM's waiting queue by priority (smaller first, ties: arrival); the prompts it
    # has started run first whatever their priority. In the engine: A 400 tokens,
    # started (200 left), B 300 waiting due at 2000, C 500 waiting due at 5000.
    (None, []),  # the deadline check off: arrival order, everything ahead
    (1000, [300, 500]),  # due before B and C: it passes both
    (2000, [500]),  # due with B, which came first
    (3000, [500]),
    (9000, []),
])
def test_a_newcomer_passes_the_prompts_waiting_in_the_engine_that_are_due_after_it(
        newcomer, passed):
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        # a busy engine (a decode running) whose step in progress began before the
        # prompts came: it holds none of them
        adm.load._second.on_scheduler(1, 0, 0.1)
        adm.engine_model.last_step_end = time.monotonic() - 0.001
        loop, prefills = asyncio.get_running_loop(), []
        for tokens, priority in ((400, RT), (300, RT + 2000), (500, RT + 5000)):
            await adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=tokens)
            adm.load.admit(tokens)
            prefills.append(PrefillEnd(adm, tokens, loop, priority))
        prefills[0].chunk(200)  # A is started: vLLM runs it before any waiting prompt
        work = adm.work_ahead(R.PRIORITY_REALTIME, adm.load.admit(0), time.monotonic(),
                              priority=None if newcomer is None else RT + newcomer)
        prefills[1].ended()  # B has its first token: nobody passes it any more
        return work, adm.work_ahead(R.PRIORITY_REALTIME, adm.load.admit(0),
                                    time.monotonic(), priority=RT + 1000)

    work, later = asyncio.run(scenario())
    assert work.prefill_tokens == 200 + 300 + 500 - sum(passed)
    assert work.prompts == 3 - len(passed)
    assert work.prefill_pairs == attention_pairs(200, 200) + sum(
        attention_pairs(0, t) for t in (300, 500) if t not in passed)
    assert later.queue == (Prompt(200, 200, 0, True),)  # A alone: C passed, B done


def test_the_kv_of_the_next_preemption_victim_due_after_a_newcomer_counts_as_preemptable():
    """vLLM preempts one running request, the one due last, when a running one finds no
    free block, and no other until that room is used up: the victim's cache is what a
    newcomer's KV wait can count on, if it is due after the newcomer; a prompt still
    waiting in the engine holds none, and a request that ended holds nothing."""
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        loop, ends = asyncio.get_running_loop(), []
        for tokens, priority in ((400, 3000), (300, 2000), (500, 5000)):
            await adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=tokens)
            adm.load.admit(tokens)
            ends.append(PrefillEnd(adm, tokens, loop, priority))
        ends[0].chunk(200)  # half prefilled: 200 tokens in the cache
        ends[2].ended()  # its first token: the whole prompt is in the cache
        seen = [adm.load.preemptable_by(p) for p in (1000, 4000, 6000, None)]
        ends[2].release(16)  # it ended: its cache is free, nobody preempts it
        seen += [adm.load.preemptable_by(p) for p in (1000, 4000)]
        work = adm.work_ahead(R.PRIORITY_REALTIME, adm.load.admit(0), time.monotonic(),
                              priority=1000)
        return seen, work.kv_preemptable

    # the victim is the request due at 5000 (500 tokens), then the one due at 3000 (200)
    assert asyncio.run(scenario()) == ([500, 500, 0, 0, 200, 0], 200)


def test_the_kv_use_rate_is_the_tokens_recent_steps_computed_a_second():
    load = LoadTracker(EngineSecond())
    assert load.kv_use_rate == 0.0  # no step yet
    load.on_step(StepRecord(1, 0.0, 0.1, 0.0, 200, ("a",)))
    assert load.kv_use_rate == pytest.approx(2000.0)
    load.on_step(StepRecord(2, 0.1, 0.3, 0.0, 200, ("a",)))  # 20% weight on the newest
    assert load.kv_use_rate == pytest.approx(200.0 / (0.8 * 0.1 + 0.2 * 0.3))


@pytest.mark.parametrize("entered_s_ago, since_step_s, running, ahead, in_step", [
    # a 600-token prompt entered before the step in progress began: the step holds it,
    # so it is not work ahead after the step; the step has 0.02 s less to go
    (0.3, 0.02, 1, 0, "step-0.02"),
    # ... entered after the step began (the engine is decoding, a step of one decode
    # whose phase is not known: half of it to go): all of it is ahead
    (0.05, 0.1, 1, 600, "decode"),
    # ... entered an idle engine (nothing running, nothing held when its last step
    # ended): the engine began a step with it as it came, 0.05 s ago
    (0.05, 0.1, 0, 0, "step-0.05"),
    # no step seen yet: its phase unknown, half a step that holds it
    (0.3, None, 0, 0, "half"),
])
def test_the_step_in_progress_holds_the_prompts_that_entered_before_it_began(
        entered_s_ago, since_step_s, running, ahead, in_step):
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        now = time.monotonic()
        adm.limiter._enter(600)
        adm.load._second.on_scheduler(running, 0, 0.1)
        adm.engine_model.last_step_end = 0.0 if since_step_s is None else now - since_step_s
        adm.load.admit(600)  # it has no first token yet
        # due before the newcomer: never passed, it is ahead unless a step holds it
        PrefillEnd(adm, 600, asyncio.get_running_loop(), 0).entered_at = now - entered_s_ago
        return adm.work_ahead(R.PRIORITY_REALTIME, adm.load.admit(0), now, priority=1000)

    work = asyncio.run(scenario())
    model = _admission(Decisions(8)).engine_model.model
    step = model.step_s(running + 1, running + 600, attention_pairs(0, 600))
    expected = {"step-0.02": step - 0.02, "step-0.05": step - 0.05, "half": 0.5 * step,
                "decode": 0.5 * model.step_s(1, 1, 0)}[in_step]
    assert work.prefill_tokens == ahead
    assert work.step_remaining_s == pytest.approx(expected)


def test_a_newcomer_passes_no_prompt_the_step_in_progress_started():
    """The step took its chunk from the prompt vLLM had started (A, 100 tokens left),
    then from the waiting ones by priority (B due at 2000: 300 tokens); C (due at 5000)
    got none of it. Until a chunk of B is reported it still reads as waiting, but vLLM
    runs B's rest before any waiting prompt: a newcomer due first passes C alone. A
    prompt whose first token came (D) takes nothing of the step, whatever the chunk
    reports said."""
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        adm.load._second.on_scheduler(2, 0, 0.1)  # one decode and A running
        loop, prefills = asyncio.get_running_loop(), []
        for tokens, priority in ((400, RT), (3000, RT + 2000), (500, RT + 5000)):
            await adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=tokens)
            adm.load.admit(tokens)
            prefills.append(PrefillEnd(adm, tokens, loop, priority))
        prefills[0].chunk(300)
        await adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=2000)
        adm.load.admit(2000)
        PrefillEnd(adm, 2000, loop, RT).ended()  # its first token came: none of it is left
        adm.engine_model.last_step_end = time.monotonic()  # the step began: it holds all
        work = adm.work_ahead(R.PRIORITY_REALTIME, adm.load.admit(0), time.monotonic(),
                              priority=RT + 1000)
        return adm.engine_model.model, work

    model, work = asyncio.run(scenario())
    chunk = model.token_budget - 1  # beside the decode: A's rest and part of B
    assert work.prefill_tokens == 100 + 3000 - chunk
    assert work.queue == (Prompt(100 + 3000 - chunk, chunk - 100, 0, True),)  # B, started


def test_an_admitted_prompt_stands_at_the_prefill_gate_until_its_first_token():
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        admitted = await adm.admit(_record(), _prompt(300), 300, 16)
        held = adm.limiter.engine_prefill_tokens
        adm.first_token(admitted.prompt_tokens)
        after_first = adm.limiter.engine_prefill_tokens
        adm.release(None)
        failed = await adm.admit(_record(), _prompt(200), 200, 16)
        adm.release(failed.prompt_tokens)  # ended before a first token
        return held, after_first, adm.limiter.engine_prefill_tokens, adm.limiter.in_flight
    assert asyncio.run(scenario()) == (300, 0, 0, 0)


def test_a_prompt_ends_once_whichever_signal_comes_first_and_never_after_the_end():
    """The step probe (from its thread) and a streamed first output both say a prompt
    is prefilled: admission hears it once; a request that ended first hears nothing."""
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        loop, seen = asyncio.get_running_loop(), []
        first = await adm.admit(_record(), _prompt(300), 300, 16)
        second = await adm.admit(_record(), _prompt(200), 200, 16)
        probe = PrefillEnd(adm, first.prompt_tokens, loop)
        await loop.run_in_executor(None, probe.from_any_thread)
        await asyncio.sleep(0)
        seen.append(adm.limiter.engine_prefill_tokens)  # the first prompt is done
        probe.ended()  # its first output: already counted
        seen.append((adm.limiter.engine_prefill_tokens, probe.close()))
        late = PrefillEnd(adm, second.prompt_tokens, loop)
        pending = late.close()  # ended (aborted) before its prompt was done
        late.from_any_thread()
        await asyncio.sleep(0)
        adm.release(None)
        adm.release(pending)
        return seen, pending, adm.limiter.engine_prefill_tokens, adm.load.admit(0)
    seen, pending, left, load = asyncio.run(scenario())
    assert seen == [200, (200, None)] and pending == 200
    assert left == 0 and load.pending_prefill_tokens == 0


def test_a_chunked_prompt_leaves_the_work_ahead_chunk_by_chunk():
    """A long prompt under chunked prefill: each chunk the probe reports is that much
    less work ahead of newcomers and at the gate; its end releases what is left; an
    over-long report is clamped, and one after the end changes nothing."""
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        loop, seen = asyncio.get_running_loop(), []
        doc = await adm.admit(_record(), _prompt(4000), 4000, 16)
        aborted = await adm.admit(_record(), _prompt(3000), 3000, 16)
        probe, other = PrefillEnd(adm, doc.prompt_tokens, loop), \
            PrefillEnd(adm, aborted.prompt_tokens, loop)

        def state():  # the gate's count and the load's (the work ahead's source)
            return adm.limiter.engine_prefill_tokens, adm.load.pending[1], adm.load.pending_pairs
        seen.append(state())
        await loop.run_in_executor(None, probe.chunk_from_any_thread, 2048)
        await asyncio.sleep(0)
        seen.append(state())
        other.chunk(2048)
        seen.append(state())
        probe.chunk(5000)  # more than is left: clamped
        probe.ended()
        seen.append(state())
        probe.chunk(100)  # after the end: nothing
        probe.release(generated=16)
        other.release()  # aborted mid-prompt: its rest goes
        seen.append(state())
        return seen, adm.load.pending, adm.limiter.kv_free_rate()
    seen, pending, kv_rate = asyncio.run(scenario())
    # the KV they held freed: the document's 4,000 and 16 generated, the 2,048 computed
    # of the other, over the limiter's 10 s window
    assert kv_rate == (4000 + 16 + 2048) / 10
    # attention pairs: a fresh prompt of n tokens n(n+1)/2; what is left of one after
    # c of it, m tokens: c*m + m(m+1)/2 (the rest of a document is its dear part)
    doc, other = 4000 * 4001 // 2, 3000 * 3001 // 2
    doc_rest, other_rest = 2048 * 1952 + 1952 * 1953 // 2, 2048 * 952 + 952 * 953 // 2
    assert seen == [(7000, 7000, doc + other), (4952, 4952, doc_rest + other),
                    (2904, 2904, doc_rest + other_rest), (952, 952, other_rest), (0, 0, 0)]
    assert pending == (0, 0) and doc_rest > doc / 2


def test_a_request_with_a_first_token_frees_its_whole_prompt_whatever_the_probe_saw():
    """Its output can come before the probe's chunk report (they travel apart): the
    KV it held is still its whole prompt and what it generated."""
    async def scenario():
        adm = _admission(Decisions(8, **DEADLINE), 5.0)
        loop = asyncio.get_running_loop()
        await adm.admit(_record(), _prompt(500), 500, 16)
        probe = PrefillEnd(adm, 500, loop)
        probe.ended()  # the first output, before any chunk report
        probe.chunk(500)  # the report, late: nothing
        probe.release(generated=16)
        return adm.limiter.kv_free_rate()
    assert asyncio.run(scenario()) == (500 + 16) / 10


def test_work_ahead_in_its_own_lane_counts_only_those_due_before_it():
    async def scenario():
        adm = _admission(Decisions(1, **DEADLINE), 0.5, limit=1)
        await adm.limiter.acquire(R.PRIORITY_REALTIME)
        waiters = [asyncio.create_task(adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=t,
                                                           deadline=d))
                   for t, d in ((400, 10.0), (100, 20.0))]
        await asyncio.sleep(0.01)
        load, now = adm.load.admit(0), time.monotonic()
        out = [adm.work_ahead(R.PRIORITY_REALTIME, load, now, due).prefill_tokens
               for due in (5.0, 15.0, 25.0)]
        for w in waiters:
            w.cancel()
        return out
    assert asyncio.run(scenario()) == [0, 400, 500]


def test_the_limiter_serves_realtime_before_batch_and_fifo_within_a_lane():
    async def scenario():
        limiter, order = Limiter(1), []
        await limiter.acquire(R.PRIORITY_REALTIME)

        async def wait(name, lane):
            await limiter.acquire(lane)
            order.append(name)
            limiter.release()

        tasks = [asyncio.create_task(wait(n, lane)) for n, lane in (
            ("b1", R.PRIORITY_BATCH), ("r1", R.PRIORITY_REALTIME),
            ("b2", R.PRIORITY_BATCH), ("r2", R.PRIORITY_REALTIME))]
        await asyncio.sleep(0.01)
        assert limiter.waiting == 4
        limiter.release()
        await asyncio.gather(*tasks)
        return order, limiter.in_flight

    assert asyncio.run(scenario()) == (["r1", "r2", "b1", "b2"], 0)


def test_raising_the_limit_admits_waiters_and_lowering_it_interrupts_nobody():
    async def scenario():
        limiter = Limiter(1)
        await limiter.acquire(R.PRIORITY_REALTIME)
        waiters = [asyncio.create_task(limiter.acquire(R.PRIORITY_BATCH)) for _ in range(3)]
        await asyncio.sleep(0.01)
        limiter.limit = 3
        await asyncio.sleep(0.01)
        admitted = sum(w.done() for w in waiters)
        limiter.limit = 1  # three hold slots; nobody is taken out
        held = limiter.in_flight
        for _ in range(held):
            limiter.release()
        await asyncio.gather(*waiters)
        return admitted, held, limiter.in_flight

    assert asyncio.run(scenario()) == (2, 3, 1)


def test_a_waiter_gives_up_after_max_wait_and_leaves_the_queue():
    async def scenario():
        limiter = Limiter(1, max_wait_s=0.05)
        await limiter.acquire(R.PRIORITY_REALTIME)
        with pytest.raises(LimiterTimeout):
            await limiter.acquire(R.PRIORITY_BATCH)
        return limiter.waiting, limiter.in_flight

    assert asyncio.run(scenario()) == (0, 1)


def test_a_realtime_waiter_whose_slot_comes_too_late_moves_to_the_batch_lane():
    """Admitted on the slot-wait estimate (one release every 10 ms lately), but the
    slot does not come: at its deadline less its own prefill it changes lane, and
    enters the engine with the batch lane's priority."""
    async def scenario():
        adm = _admission(Decisions(1, **DEADLINE), target_s=0.3, limit=1)
        for _ in range(1000):  # a busy recent past: slots free up fast
            await adm.limiter.acquire(R.PRIORITY_REALTIME)
            adm.limiter.release()
        await adm.limiter.acquire(R.PRIORITY_REALTIME)  # the engine's one slot is taken
        rec = _record()
        rec.arrival = time.monotonic()
        task = asyncio.create_task(adm.admit(rec, _prompt(10), 10, 4))
        await asyncio.sleep(0.4)  # past its 300 ms target, still waiting
        waiting_in = [lane for lane, q in adm.limiter._lanes.items() if q]
        adm.limiter.release()
        return rec, waiting_in, await task, adm.epoch

    rec, waiting_in, verdict, epoch = asyncio.run(scenario())
    assert waiting_in == [R.PRIORITY_BATCH]
    assert rec.priority == R.PRIORITY_BATCH and rec.policy_actions == ["demote:deadline"]
    assert verdict.priority == engine_priority(R.PRIORITY_BATCH, rec.arrival + 0.3, epoch)


def test_without_overload_a_realtime_waiter_keeps_its_lane():
    async def scenario():
        adm = _admission(Decisions(1), target_s=0.05, limit=1)
        await adm.limiter.acquire(R.PRIORITY_REALTIME)
        rec = _record()
        task = asyncio.create_task(adm.admit(rec, _prompt(10), 10, 4))
        await asyncio.sleep(0.1)
        adm.limiter.release()
        await task
        return rec

    rec = asyncio.run(scenario())
    assert rec.priority == R.PRIORITY_REALTIME and rec.policy_actions == []


@pytest.mark.parametrize("priority,actions", [
    (R.PRIORITY_REALTIME, ["demote:unattainable"]), (R.PRIORITY_BATCH, [])])
def test_a_deadline_no_engine_could_meet_is_served_best_effort_in_the_batch_lane(
        priority, actions):
    """A 1 ms target: late even on an idle engine. Refusing it would only mean never
    serving it, so it is served in the batch lane, and never refused."""
    adm = _admission(Decisions(8, **DEADLINE), target_s=0.001)
    rec = _record(priority)
    rec.arrival = time.monotonic()
    verdict = asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    assert not isinstance(verdict, Refusal)
    assert rec.priority == R.PRIORITY_BATCH and rec.policy_actions == actions
    assert adm.refused_deadline == 0


def test_while_the_check_refuses_others_a_deadline_no_engine_could_meet_is_deferred():
    """The same request while the check has been refusing requests that could be on
    time (the predicted-miss policy active): refused at once with 429 and the drain time,
    to be served best effort once the surge drains; not counted as a deadline refusal
    (the policy reads those, and deferring must not keep it on). A VIP still enters."""
    adm = _admission(Decisions(8, refusing_late=True, **DEADLINE), target_s=0.001)
    rec = _record()
    rec.arrival = time.monotonic()
    verdict = asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    err = from_refusal(verdict)
    assert (err.status, err.error_type) == (429, "unattainable")
    assert err.headers == {"Retry-After": "1"}
    assert rec.policy_actions == ["refuse:unattainable"] and rec.prompt_tokens == 10
    assert adm.refused_deadline == 0 and adm.load.pending == (0, 0)
    vip = _record(vip=True)
    vip.arrival = time.monotonic()
    assert not isinstance(asyncio.run(adm.admit(vip, _prompt(10), 10, 4)), Refusal)
