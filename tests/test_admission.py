"""Admission without an engine: the limiter's lanes and limits, and each per-request
decision (cap, shed, truncation, predicted miss) on a real record with the real
predictor service (seed formula)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from observe import registry as R
from observe.record import RequestRecord
from serving.admission import Admission, Refusal
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.errors import from_refusal
from serving.guard.live_predictor import PredictionService
from serving.limiter import Limiter, LimiterTimeout
from slo.policy.decisions import Decisions


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
    assert rec.prediction.version == "seed-003" and rec.load.pending_requests == 0


@pytest.mark.parametrize("priority,target_s,outcome", [
    (R.PRIORITY_REALTIME, 0.001, "demote:predicted_miss"),  # seed predicts >= 50 ms
    (R.PRIORITY_BATCH, 0.001, "shed:predicted_miss"),
    (R.PRIORITY_REALTIME, 10.0, None),  # predicted well within its target
])
def test_a_far_predicted_miss_changes_lane_or_is_shed(priority, target_s, outcome):
    adm = _admission(Decisions(8, predicted_miss_factor=2.0), target_s)
    rec = _record(priority)
    verdict = asyncio.run(adm.admit(rec, _prompt(10), 10, 4))
    if outcome == "shed:predicted_miss":
        assert isinstance(verdict, Refusal)
        assert from_refusal(verdict).status == 503 and adm.load.pending == (0, 0)
    else:
        assert not isinstance(verdict, Refusal)
        assert rec.priority == (R.PRIORITY_BATCH if outcome else priority)
    assert rec.policy_actions == ([outcome] if outcome else [])


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


def test_under_overload_a_realtime_waiter_past_its_target_moves_to_the_batch_lane():
    async def scenario():
        adm = _admission(Decisions(1, predicted_miss_factor=1e9), target_s=0.05, limit=1)
        await adm.limiter.acquire(R.PRIORITY_REALTIME)  # the engine's one slot is taken
        rec = _record()
        rec.arrival = time.monotonic()
        task = asyncio.create_task(adm.admit(rec, _prompt(10), 10, 4))
        await asyncio.sleep(0.15)  # past its 50 ms target, still waiting
        waiting_in = [lane for lane, q in adm.limiter._lanes.items() if q]
        adm.limiter.release()
        await task
        return rec, waiting_in

    rec, waiting_in = asyncio.run(scenario())
    assert waiting_in == [R.PRIORITY_BATCH]
    assert rec.priority == R.PRIORITY_BATCH and rec.policy_actions == ["demote:deadline"]


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
