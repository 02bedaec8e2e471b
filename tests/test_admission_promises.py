"""Admission keeps its promises (`slo.policy.promises` through `serving.admission`): with
a real limiter, load tracker and the prompts the engine holds, a later-due request waits
in front while it would make an earlier one late, is estimated as waiting, and enters
once the earlier prompt has its first token; VIPs and a server with the rule off are
never held."""

from __future__ import annotations

import asyncio
import time

import pytest

from observe import registry as R
from observe.record import RequestRecord
from observe.stats import WallClock
from serving.admission import Admission
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker, PrefillEnd
from serving.engine.stats import EngineSecond
from serving.guard.live_predictor import PredictionService
from serving.limiter import Limiter
from slo.policy.decisions import Decisions
from slo.sim.engine_model import EngineModel
from slo.sim.lanes import LANE_VIP, engine_priority

# 10 ms + 1 ms a token a step, 1000 tokens, an adaptive cap of 250: a 400-token prompt
# alone takes 0.41 s, beside another 400 in one step 0.81 s.
MODEL = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.001,
                    step_per_pair_s=0.0, token_budget=1000, kv_capacity_tokens=100_000,
                    prefill_chunk_cap=250, prefill_cap_adaptive=True)


def _admission(keep: bool = True) -> Admission:
    service = PredictionService(None, None, retrain_interval_s=0)
    adm = Admission(LoadTracker(EngineSecond()), service, Limiter(8), FaultInjector(),
                    lambda tokens: 1.0)
    adm.engine_model.model = MODEL
    adm.publish(Decisions(8, deadline_margin=1.0, keep_promises=keep))
    return adm


async def _earlier(adm: Admission, due_in_s: float, tokens: int = 400) -> PrefillEnd:
    """A realtime prompt in the engine, waiting there, due in `due_in_s`."""
    loop = asyncio.get_running_loop()
    await adm.limiter.acquire(R.PRIORITY_REALTIME, tokens=tokens)
    adm.load.admit(tokens)
    due = time.monotonic() + due_in_s
    return PrefillEnd(adm, tokens, loop, engine_priority(R.PRIORITY_REALTIME, due, adm.epoch))


@pytest.mark.parametrize("keep,lane,due_in_s,held", [
    (True, R.PRIORITY_BATCH, 0.45, True),  # 0.41 s alone, 0.81 s beside the document
    (True, R.PRIORITY_BATCH, 2.0, False),  # slack enough for both
    (True, R.PRIORITY_BATCH, 0.3, False),  # late anyway: holding saves nothing
    (True, LANE_VIP, 0.45, False),  # a VIP is never held
    (False, R.PRIORITY_BATCH, 0.45, False),  # the rule off
])
def test_who_waits_for_an_earlier_promise(keep, lane, due_in_s, held):
    async def scenario():
        adm = _admission(keep)
        await _earlier(adm, due_in_s)
        later = time.monotonic() + 5.0
        return adm.holds_back(lane, 400, later)
    assert asyncio.run(scenario()) is held


def test_a_held_request_enters_once_the_earlier_prompt_has_its_first_token():
    async def scenario():
        adm = _admission()
        first = await _earlier(adm, 0.45)
        doc = asyncio.create_task(adm.limiter.acquire(
            R.PRIORITY_BATCH, tokens=400, deadline=time.monotonic() + 5.0))
        for _ in range(10):
            await asyncio.sleep(0)
        held = (doc.done(), adm.limiter.waiting)
        first.chunk(400)  # its whole prompt in one chunk: the first token comes
        first.ended()
        await asyncio.wait_for(doc, 1.0)
        return held, adm.limiter.in_flight
    assert asyncio.run(scenario()) == ((False, 1), 2)


def test_a_request_that_would_be_held_is_estimated_after_the_prompt_ahead():
    """Judged while it would have to wait, its estimate does not have it advance beside
    the earlier prompt: it comes after it. 1,600 tokens alone take two steps (1.62 s,
    due at 1.7 s), and a 200-token prompt beside them makes them late. With no step
    seen yet, the check takes half of a 1,000-token step (0.505 s) as in progress,
    600 tokens left after it; beside them the newcomer would take one step with a
    500-token chunk of theirs (0.71 s), after them one of 800 tokens (0.81 s)."""
    async def scenario():
        estimates = []
        for keep in (False, True):
            adm = _admission(keep)
            await _earlier(adm, 1.7, 1600)
            rec = RequestRecord("r", time.monotonic(), "text_completion",
                                priority=R.PRIORITY_REALTIME)
            adm.ttft_target = lambda tokens: 5.0
            await adm.admit(rec, {"prompt_token_ids": list(range(200))}, 200, 8)
            estimates.append(rec.ttft_estimate_s)
        return estimates
    beside, after = asyncio.run(scenario())
    assert beside == pytest.approx(0.505 + 0.71, abs=0.005)
    assert after == pytest.approx(0.505 + 0.81, abs=0.005)


def _book_retry(adm: Admission) -> float:
    """A refused realtime request of 100 tokens told to come back in 1 s (the least a
    Retry-After says), its first token due 0.2 s after: alone, one 0.11 s step."""
    now = time.monotonic()
    assert adm.retries.book("c", 100, now, 0.01, 0.11, R.PRIORITY_REALTIME, 0.2) == 1
    return now


def test_a_document_waits_for_a_booked_retry_and_enters_after_its_first_token():
    """A 2,000-token batch document entering now would still be prefilling when the
    retry comes (its first step alone is 1.01 s) and make it late (1.62 s against
    1.2 s); held, it enters once the retry has had its first token. The retry itself
    is not held by its own booking."""
    async def scenario():
        adm = _admission()
        _book_retry(adm)
        doc = asyncio.create_task(adm.limiter.acquire(
            R.PRIORITY_BATCH, tokens=2000, deadline=time.monotonic() + 5.0))
        for _ in range(10):
            await asyncio.sleep(0)
        held = (doc.done(), adm.limiter.promise_holds)
        assert adm.retries.claim("c", 100, time.monotonic())  # it came back, 1 s early
        retry = await _earlier(adm, 0.2, 100)  # let in past the held document
        still = doc.done()
        retry.chunk(100)
        retry.ended()
        await asyncio.wait_for(doc, 1.0)
        return held, still, adm.limiter.in_flight
    assert asyncio.run(scenario()) == ((False, 1), False, 2)


def test_a_booked_retry_that_never_comes_holds_nobody_past_its_deadline():
    async def scenario():
        adm = _admission()
        booked_at = _book_retry(adm)
        await adm.limiter.acquire(R.PRIORITY_BATCH, tokens=2000,
                                  deadline=time.monotonic() + 5.0)
        return time.monotonic() - booked_at
    assert 1.2 <= asyncio.run(scenario()) < 1.5  # released by time, at the retry's deadline


def test_the_row_says_how_long_a_request_waited_in_front_of_the_engine():
    """`admission_wait_s`: the hold of a document the promise keeper kept out until
    the earlier prompt's first token (released here after 0.2 s), next to nothing for
    a VIP that enters at once, and nothing at all for a request never admitted."""
    async def scenario():
        adm = _admission()
        adm.ttft_target = lambda tokens: 5.0
        first = await _earlier(adm, 0.45)
        doc = RequestRecord("doc", time.monotonic(), "text_completion",
                            priority=R.PRIORITY_BATCH)
        task = asyncio.create_task(adm.admit(doc, {"prompt_token_ids": [1] * 400}, 400, 8))
        for _ in range(10):  # judged and waiting in front before the 0.2 s begin
            await asyncio.sleep(0)
        held = adm.limiter.waiting
        await asyncio.sleep(0.2)
        held = (held, task.done())
        first.chunk(400)
        first.ended()
        await asyncio.wait_for(task, 1.0)
        vip = RequestRecord("vip", time.monotonic(), "text_completion", vip=True,
                            priority=R.PRIORITY_REALTIME)
        await adm.admit(vip, {"prompt_token_ids": [1] * 400}, 400, 8)
        return held, doc.admission_wait_s, vip.admission_wait_s
    held, doc_wait, vip_wait = asyncio.run(scenario())
    assert held == (1, False) and 0.2 <= doc_wait < 1.0
    assert 0.0 <= vip_wait < 0.05
    assert RequestRecord("r", 0.0, "text_completion").row(WallClock())["admission_wait_s"] is None


def test_a_booked_retry_is_let_in_past_a_full_limit_where_a_newcomer_is_refused():
    """The limit is full (the next slot frees in 2.5 s at the recent release rate): a
    newcomer due in 0.2 s is refused; the refused request back for its booking is
    estimated without the slot wait (one 0.11 s step alone) and enters at once."""
    async def scenario():
        adm = _admission()
        adm.ttft_target = lambda tokens: 0.2
        adm.limiter.limit, adm.limiter.in_flight = 1, 5
        for _ in range(4):
            adm.limiter.release(None)
        _book_retry(adm)
        fresh, retry = (RequestRecord(name, time.monotonic(), "text_completion",
                                      client=name) for name in ("d", "c"))
        refused = await adm.admit(fresh, {"prompt_token_ids": [1] * 100}, 100, 8)
        admitted = await adm.admit(retry, {"prompt_token_ids": [1] * 100}, 100, 8)
        return (refused.reason, fresh.policy_actions, type(admitted).__name__,
                retry.policy_actions, adm.limiter.in_flight, retry.ttft_estimate_s)
    error, fresh_actions, admitted, actions, in_flight, estimate = asyncio.run(scenario())
    assert (error, fresh_actions) == ("deadline", ["refuse:deadline"])
    assert (admitted, actions, in_flight) == ("Admitted", ["retry:booked"], 2)
    assert estimate == pytest.approx(0.11, abs=0.005)
