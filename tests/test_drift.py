"""Retraining on drift: the live model's TTFT p90 coverage over its newest judged
requests falls under 80%, and a retrain (through the same holdout gate) comes at once
instead of at the next scheduled one."""

from __future__ import annotations

import itertools
import threading

from observe.record import LatencyPrediction, RequestRecord
from observe.stats import EngineTimes
from serving.guard.live_predictor import PredictionService
from slo.predict.drift import DRIFT_COOLDOWN_S, DriftWatch

_IDS = itertools.count()


def _served(ttft: float, p90: float = 1.0, version: str = "m1", status: str = "ok"
            ) -> RequestRecord:
    """A finished request: TTFT `ttft` against a predicted p50 0.5 s, p90 `p90`."""
    rec = RequestRecord(f"r{next(_IDS)}", arrival=100.0, endpoint="chat", prompt_tokens=100,
                        output_tokens=1,
                        prediction=LatencyPrediction(0.5, p90, None, None, None, version))
    rec.engine = EngineTimes(100.0, 100.0, 100.0 + ttft, 100.0 + ttft)
    rec.first_token = rec.end = 100.0 + ttft
    rec.status = status
    return rec


def _feed(watch: DriftWatch, covered: int, missed: int, now: float = 0.0, **kw) -> list[bool]:
    recs = [_served(0.5, **kw) for _ in range(covered)] + \
        [_served(2.0, **kw) for _ in range(missed)]
    return [watch.observe(rec, now) for rec in recs]


def test_coverage_under_80_percent_over_100_judged_calls_for_a_retrain():
    watch = DriftWatch()
    fired = _feed(watch, 79, 21)  # 79% covered after exactly 100
    assert fired == [False] * 99 + [True]
    assert watch.coverage() is None  # the window starts afresh after a call


def test_a_healthy_or_young_model_is_left_alone():
    assert not any(_feed(DriftWatch(), 80, 20))  # 80%: the alert's line, not under it
    assert not any(_feed(DriftWatch(), 0, 99))  # 0% of 99: too few to judge


def test_the_window_holds_the_newest_200():
    watch = DriftWatch()
    assert not any(_feed(watch, 200, 0))
    fired = _feed(watch, 0, 41)  # 159 of 200 covered (79.5%) at the 41st miss
    assert fired == [False] * 40 + [True]


def test_one_call_per_cooldown():
    watch = DriftWatch()
    assert _feed(watch, 0, 100, now=0.0)[-1]
    assert not any(_feed(watch, 0, 100, now=DRIFT_COOLDOWN_S - 1))
    assert any(_feed(watch, 0, 100, now=DRIFT_COOLDOWN_S))


def test_a_new_model_is_judged_on_its_own_requests():
    watch = DriftWatch()
    _feed(watch, 0, 99, version="old")
    assert not any(_feed(watch, 1, 0, version="new"))
    assert watch.coverage() == 1.0


def test_unjudged_requests_do_not_count():
    watch = DriftWatch()
    assert not any(_feed(watch, 0, 150, status="rejected"))
    assert not any(watch.observe(_served(2.0, p90=float("nan")), 0.0) for _ in range(150))
    assert watch.coverage() is None


def _service(interval_s: float) -> tuple[PredictionService, list[str], threading.Event]:
    service = PredictionService(None, None, retrain_interval_s=interval_s)
    calls, done = [], threading.Event()

    def retrain(trigger: str = "periodic") -> dict:
        calls.append(trigger)
        done.set()
        return {}

    service.retrain = retrain
    return service, calls, done


def test_the_live_predictor_retrains_on_drift_through_the_gate():
    service, calls, done = _service(600.0)
    for _ in range(100):
        service.on_request(_served(2.0))
    assert done.wait(5.0) and calls == ["drift"]


def test_no_drift_retrain_when_retraining_is_off():
    service, calls, _ = _service(0.0)
    for _ in range(100):
        service.on_request(_served(2.0))
    assert calls == []
