"""VIP work still to come, exactly: the recent VIP prompt rate over a newcomer's time left
(`slo.policy.vip_stream`), counted ahead of every non-VIP request by the server's
deadline check and by the simulator's, never ahead of a VIP."""

from __future__ import annotations

import asyncio
import time

import pytest

from observe import registry as R
from observe.record import RequestRecord
from serving.admission import Admission
from serving.guard.verdicts import Refusal
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.guard.live_predictor import QUEUE_VERSION, PredictionService
from serving.limiter import Limiter
from slo.policy import conditions as P
from slo.policy import feasibility as F
from slo.policy.decisions import Decisions
from slo.policy.vip_stream import VipStream
from slo.predict.calibration import MIN_SAMPLES, PRIOR_P50
from slo.sim.engine_model import EngineModel, attention_pairs
from slo.sim.request import SimRequest
from slo.sim.simulation import Simulator


@pytest.mark.parametrize("case,arrivals,now,horizon,expected", [
    ("none lately: nothing to come", [], 10.0, 1.0, (0, 0)),
    ("two 500-token VIPs in 5 s, 0.5 s left: a tenth of them", [(9.0, 500), (9.5, 500)],
     10.0, 0.5, (100, round(2 * attention_pairs(0, 500) * 0.1))),
    ("older than the window: forgotten", [(4.0, 500), (9.0, 300)], 10.0, 5.0,
     (300, attention_pairs(0, 300))),
    ("no time left: nothing", [(9.0, 500)], 10.0, 0.0, (0, 0)),
    ("a horizon longer than ten windows counts ten", [(9.0, 100)], 10.0, 600.0, (1000,
     10 * attention_pairs(0, 100))),
])
def test_the_expected_vip_work_is_the_recent_rate_over_the_time_left(
        case, arrivals, now, horizon, expected):
    stream = VipStream()
    for when, tokens in arrivals:
        stream.arrived(tokens, when)
    assert stream.expected(horizon, now) == expected, case


def test_a_window_must_be_positive():
    with pytest.raises(ValueError):
        VipStream(window_s=0)


DEADLINE = dict(deadline_margin=0.8, deadline_truncate_tokens=4096)


def _judged(vip: bool, surge: bool) -> tuple[bool, list[str]]:
    service = PredictionService(None, None, retrain_interval_s=0)
    adm = Admission(LoadTracker(EngineSecond()), service, Limiter(8), FaultInjector(),
                    lambda tokens: 0.5)
    adm.engine_model.set_engine_limits(2048, kv_capacity_tokens=10_000_000)
    adm.publish(Decisions(8, **DEADLINE))
    now = time.monotonic()
    if surge:  # 2,000,000 VIP prompt tokens in the last 5 s: 200,000 due in 0.5 s
        for i in range(10):
            adm.vips.arrived(200_000, now - 0.1 * i)
    rec = RequestRecord("r", now, "text_completion", priority=R.PRIORITY_REALTIME)
    rec.vip = vip
    verdict = asyncio.run(adm.admit(rec, {"prompt_token_ids": [1] * 10}, 10, 4))
    return isinstance(verdict, Refusal), rec.policy_actions


@pytest.mark.parametrize("vip,surge,refused", [
    (False, False, False),  # an idle engine, no VIP lately: admitted
    (False, True, True),  # the same request in a VIP surge: refused now
    (True, True, False),  # a VIP never waits for VIPs still to come
])
def test_the_servers_deadline_check_counts_vips_still_to_come(vip, surge, refused):
    got, actions = _judged(vip, surge)
    assert got is refused and actions == (["refuse:deadline"] if refused else [])


def _simulated(vip_history: bool) -> int:
    """A 2,000-token prompt in the engine ahead of a newcomer of 10 tokens (0.5 s target)."""
    model = EngineModel(0.01, 0.0, 2e-5, 1e-9, token_budget=2048,
                        kv_capacity_tokens=10_000_000)
    sim = Simulator(model, P.PolicyConfig())
    sim.decisions = Decisions(8, **DEADLINE)
    sim.arrive(SimRequest(0.0, 2000, 4, priority=R.PRIORITY_REALTIME, target_s=5.0))
    sim._fill_slots()  # it enters the engine: 2,000 tokens to prefill ahead of anyone
    if vip_history:  # 2,000,000 VIP prompt tokens in the last 5 s
        for _ in range(10):
            sim.vips.arrived(200_000, sim.now)
    sim.arrive(SimRequest(0.0, 10, 4, priority=R.PRIORITY_REALTIME, target_s=0.5))
    return sim.refused


def test_the_simulator_counts_them_as_the_server_does():
    assert (_simulated(False), _simulated(True)) == (0, 1)


def test_the_work_ahead_gains_the_vips_expected_in_the_time_left():
    stream = VipStream()
    idle = F.WorkAhead(0, 0)
    assert stream.ahead_of(idle, 0.5, 10.0) == idle  # no VIP lately
    for i in range(10):
        stream.arrived(2_000, 10.0 - 0.1 * i)
    assert stream.ahead_of(F.WorkAhead(300, 2), 0.5, 10.0) == F.WorkAhead(
        300 + 2_000, 2, prefill_pairs=attention_pairs(0, 2_000))


def _predicted(surge: bool) -> RequestRecord:
    """A realtime request admitted with the deadline verdict off (estimated, never
    refused), with or without a VIP surge in the last 5 s."""
    service = PredictionService(None, None, retrain_interval_s=0)
    adm = Admission(LoadTracker(EngineSecond()), service, Limiter(8), FaultInjector(),
                    lambda tokens: 0.5)
    adm.engine_model.set_engine_limits(2048, kv_capacity_tokens=10_000_000)
    adm.publish(Decisions(8))
    now = time.monotonic()
    if surge:
        for i in range(10):
            adm.vips.arrived(20_000, now - 0.1 * i)
    rec = RequestRecord("r", now, "text_completion", priority=R.PRIORITY_REALTIME)
    asyncio.run(adm.admit(rec, {"prompt_token_ids": [1] * 10}, 10, 4))
    return rec


def test_the_prediction_leaves_out_the_verdicts_allowance_for_vips_to_come():
    """The verdict counts VIPs over the whole time left, on purpose too many; the
    latency prediction (and the calibration that learns from it) takes the estimate
    without them: in the surge report that allowance alone raised the TTFT error."""
    quiet, surge = _predicted(False), _predicted(True)
    assert surge.ttft_estimate_s > quiet.ttft_estimate_s + 0.01  # 2,000 VIP tokens ahead
    assert surge.ttft_expected_s == pytest.approx(quiet.ttft_expected_s, abs=2e-3)
    assert quiet.ttft_expected_s == pytest.approx(quiet.ttft_estimate_s, abs=1e-6)
    for rec in (quiet, surge):
        assert rec.prediction.ttft_s == pytest.approx(
            rec.ttft_expected_s * PRIOR_P50, rel=1e-9)
        assert rec.prediction.version == QUEUE_VERSION


def test_the_calibration_learns_from_the_expected_ttft():
    service = PredictionService(None, None, retrain_interval_s=0)
    for _ in range(MIN_SAMPLES):
        rec = RequestRecord("r", 100.0, "text_completion")
        rec.first_token, rec.ttft_expected_s, rec.ttft_estimate_s = 100.2, 0.1, 0.4
        service.on_request(rec)
    assert service.calibration.quantiles(0.1)[0] == pytest.approx(0.2)
