"""The server's predictor and forecaster services on a real trace-log file (no
engine): what they start with, when they refuse to retrain, that a trained model
is saved and picked up by the next server, and the retrain gate: a candidate goes
live only if it beats the live model on the newest requests, which it never saw."""

from __future__ import annotations

import hashlib
import json
import math
import random
from datetime import datetime, timezone
from pathlib import Path

import pytest

from observe.record import AdmissionLoad
from observe.stats import EngineSnapshot
from observe.tracelog import TraceLog
from serving.guard import live_predictor as prediction
from serving.guard.live_forecast import ForecastService, horizon_label
from serving.guard.live_predictor import MIN_RETRAIN_ROWS, PredictionService
from slo.predict.accuracy import GATE_EVENT
from slo.predict.model import MIN_ROWS, SEED_VERSION, load_model, seed_ttft_s

IDLE = AdmissionLoad(0, 0, 0.0, 0.0, 0, 0)


def _requests(log: TraceLog, n: int, start: float = 1.7e9, slower: float = 1.0,
              shuffled: int = 0) -> None:
    """`n` served requests one second apart whose latencies follow their prompt and
    load (`slower` times over); the oldest `shuffled` have their latencies permuted
    among themselves, so that their features no longer explain them."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        prompt, pending = rng.randint(10, 4000), rng.randint(0, 8)
        noise = math.exp(rng.gauss(0, 0.05))
        rows.append({
            "request_id": f"r{i}", "arrival_ts": start + i, "status": "ok",
            "prompt_tokens": prompt, "max_tokens": 32,
            "ttft_s": slower * (0.02 + 1e-4 * prompt + 0.01 * pending) * noise,
            "tpot_s": slower * (0.002 + 1e-6 * prompt + 0.0005 * pending) * noise,
            "queue_depth": 0, "running_requests": pending, "kv_cache_usage": 0.1,
            "recent_step_s": 0.01, "pending_requests": pending,
            "pending_prefill_tokens": 300 * pending, "priority": "realtime"})
    order = list(range(shuffled))
    rng.shuffle(order)
    latencies = [(rows[j]["ttft_s"], rows[j]["tpot_s"]) for j in order]
    for row, (ttft, tpot) in zip(rows, latencies):
        row["ttft_s"], row["tpot_s"] = ttft, tpot
    for row in rows:
        log.add("requests", row)
    log.flush()


@pytest.mark.parametrize("prompt", [1, 500, 3000])
def test_the_seed_formula_predicts_until_a_model_is_trained(tmp_path, prompt):
    with TraceLog(tmp_path / "t.duckdb") as log:
        service = PredictionService(log, tmp_path / "m" / "latency.pkl")
        pred = service.predict(prompt, 10, IDLE, batch=False)
    assert pred.version == SEED_VERSION
    assert pred.ttft_s == pytest.approx(seed_ttft_s(prompt))
    assert pred.e2e_s == pytest.approx(pred.ttft_s + 9 * pred.tpot_s)


@pytest.mark.parametrize("rows", [MIN_ROWS - 1, MIN_RETRAIN_ROWS - 1])
def test_too_few_requests_keep_the_current_model(tmp_path, rows):
    # 250: 200 to train on once the newest 20% (50) is held out to judge the candidate
    assert MIN_RETRAIN_ROWS == 250
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, rows, start=datetime.now(timezone.utc).timestamp() - 600)
        service = PredictionService(log, tmp_path / "latency.pkl")
        assert service.retrain() == {"trained": False, "rows": rows, "needed": MIN_RETRAIN_ROWS}
        assert service.model.version == SEED_VERSION


def test_a_trained_model_is_saved_and_loaded_by_the_next_server(tmp_path):
    path = tmp_path / "models" / "latency.pkl"
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, 600, start=datetime.now(timezone.utc).timestamp() - 3600)
        first = PredictionService(log, path)
        result = first.retrain()
        assert result["trained"] is True and result["accepted"] is True, result
        assert result["rows"] == result["training_rows"] == 480
        again = PredictionService(log, path)
    assert again.model.version == first.model.version == result["version"]
    load = AdmissionLoad(0, 3, 0.1, 0.01, 3, 900)
    assert again.predict(2000, 32, load, False) == first.predict(2000, 32, load, False)


def test_requests_outside_the_window_are_not_trained_on(tmp_path):
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, 600, start=datetime.now(timezone.utc).timestamp() - 7 * 86400)
        service = PredictionService(log, None, window_s=3600)
        assert service.retrain()["trained"] is False


def test_a_corrupt_model_file_falls_back_to_the_seed(tmp_path):
    path = tmp_path / "latency.pkl"
    path.write_bytes(b"not a pickle")
    with TraceLog(tmp_path / "t.duckdb") as log:
        assert PredictionService(log, path).model.version == SEED_VERSION


# --- the retrain gate ---------------------------------------------------------------

def _hour_ago() -> float:
    return float(int(datetime.now(timezone.utc).timestamp()) - 3600)


def _live_model(tmp_path) -> Path:
    """A model file trained on genuine traffic in a trace file of its own (accepted
    over the seed formula: the first-train rule)."""
    path = tmp_path / "models" / "latency.pkl"
    with TraceLog(tmp_path / "earlier.duckdb") as log:
        _requests(log, 600, start=_hour_ago())
        assert PredictionService(log, path).retrain()["accepted"] is True
    return path


def _decisions(log: TraceLog) -> list[tuple]:
    rows = log.query(f"SELECT from_state, to_state, reason, details FROM policy_events "
                     f"WHERE policy = '{GATE_EVENT}' ORDER BY ts").rows
    return [(*row[:3], json.loads(row[3]) if isinstance(row[3], str) else row[3])
            for row in rows]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_shuffled_latencies_are_refused_and_the_live_model_is_kept(tmp_path):
    path = _live_model(tmp_path)
    digest = _digest(path)
    with TraceLog(tmp_path / "t.duckdb") as log:
        # the 480 requests trained on carry each other's latencies; the newest 120 do not
        _requests(log, 600, start=_hour_ago(), shuffled=480)
        service = PredictionService(log, path)
        live, before = service.model, service.describe()
        result = service.retrain(trigger="admin")
        decisions = _decisions(log)
    assert result["trained"] is True and result["accepted"] is False, result
    assert result["reason"].startswith("refused: TTFT p50 median APE ")
    assert result["candidate"]["ttft_p50_median_ape"] > 3 * result["live"]["ttft_p50_median_ape"]
    assert result["live"]["version"] == result["version"] == live.version
    assert service.model is live and _digest(path) == digest
    assert {**service.describe(), "last_retrain": None} == before
    assert service.describe()["last_retrain"]["accepted"] is False
    ((was, now, reason, details),) = decisions
    assert (was, now, reason) == (live.version, live.version, result["reason"])
    assert details["accepted"] is False and details["trigger"] == "admin"
    assert details["candidate"] == result["candidate"] and details["live"] == result["live"]


def test_a_candidate_that_beats_the_live_model_goes_live(tmp_path):
    path = _live_model(tmp_path)
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, 600, start=_hour_ago(), slower=3.0)  # the engine got 3x slower
        service = PredictionService(log, path)
        old = service.model.version
        result = service.retrain()
        decisions = _decisions(log)
    assert result["accepted"] is True, result
    assert result["reason"].startswith("accepted: TTFT p50 median APE ")
    for target in ("ttft", "tpot"):
        key = f"{target}_p50_median_ape"
        assert result["candidate"][key] < result["live"][key] / 3, key
    new = result["candidate"]["version"]
    assert service.model.version == result["version"] == load_model(path).version == new != old
    ((was, now, reason, details),) = decisions
    assert (was, now, reason) == (old, new, result["reason"])
    assert details["accepted"] is True and details["trigger"] == "periodic"


class _TrueModel:
    """Predicts `_requests`' own latency rule: p50 the rule, p90 the rule times its
    noise's 90th percentile (exp(1.2816 x 0.05)), so within the goals on its traffic."""
    version = "true-rule"

    def predict_many(self, X):
        import numpy as np

        prompt, pending = X[:, 0], X[:, 6]  # FEATURES: prompt_tokens, pending_requests
        ttft, tpot = 0.02 + 1e-4 * prompt + 0.01 * pending, 0.002 + 1e-6 * prompt + 5e-4 * pending
        p90 = math.exp(1.2816 * 0.05)
        return np.stack([ttft, ttft * p90, tpot, tpot * p90], axis=1)


def test_a_scheduled_retrain_keeps_a_model_within_the_goals_without_fitting(tmp_path,
                                                                           monkeypatch):
    """A fit costs seconds of a core beside the engine: on the schedule, a live model
    whose p50 is within 10% and p90 covers 85-95% of the newest requests is kept and
    nothing is trained (the decision audited all the same); asked for (admin, drift),
    a candidate is fitted and judged as ever."""
    fits = []
    real_fit = prediction.fit_apart
    monkeypatch.setattr(prediction, "fit_apart", lambda data: fits.append(data)
                        or real_fit(data))
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, 600, start=_hour_ago())
        service = PredictionService(log, None)
        service.model = live = _TrueModel()
        kept = service.retrain()
        assert fits == [] and service.model is live
        asked = service.retrain(trigger="admin")
        decisions = _decisions(log)
    assert (kept["trained"], kept["accepted"], kept["version"]) == (False, False, live.version)
    assert kept["reason"].startswith("kept, not trained: TTFT p50 median APE "), kept
    assert kept["reason"].endswith("on the newest 120 requests, within the goals")
    assert kept["live"]["ttft_p50_median_ape"] <= 0.10
    assert 0.85 <= kept["live"]["ttft_p90_coverage"] <= 0.95
    assert kept["candidate"] == {} and len(fits) == 1 and asked["trained"] is True
    assert [(was, reason) for was, _, reason, _ in decisions] == [
        (live.version, kept["reason"]), (live.version, asked["reason"])]


def test_the_held_out_requests_are_never_trained_on(tmp_path, monkeypatch):
    trained_on = []
    real_fit = prediction.fit_apart
    monkeypatch.setattr(prediction, "fit_apart", lambda data: trained_on.append(data)
                        or real_fit(data))
    start = _hour_ago()
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, 600, start=start)
        result = PredictionService(log, None).retrain()
    ((data,),) = [trained_on]
    assert (len(data), result["training_rows"], result["holdout_rows"]) == (480, 480, 120)
    assert result["holdout_window"] == [start + 480, start + 599]
    assert data.arrival.max() == start + 479
    assert not set(data.arrival.tolist()) & {start + i for i in range(480, 600)}


def _snapshot(t: float, kv: float) -> EngineSnapshot:
    return EngineSnapshot(t, 2, 0, kv, 0, 100, 50, 10, 2.0, 2, 0.01, 0.001, 1, 10**9)


def test_without_a_backtest_the_forecast_is_the_last_value(tmp_path):
    seen = []
    with TraceLog(tmp_path / "t.duckdb") as log:
        service = ForecastService(log, None, on_forecast=lambda v, h: seen.append((v, h)),
                                  refresh_s=0)
        for second in range(12):
            service.observe(_snapshot(second, 0.25 if second < 10 else 0.5), 1.7e9 + second)
        log.flush()
        made = log.query("SELECT epoch(target_ts) - epoch(ts) AS ahead, target, horizon_s, "
                         "model, value FROM forecasts ORDER BY ts").rows
    # the last 5 s bucket holds seconds 10 and 11 (0.5 each)
    assert seen[-1] == (0.5, "5m")
    assert service.describe()["model"] == "last_value"
    # every forecast served is kept, for the time it was made for
    assert len(made) == len(seen) == 12
    assert made[-1] == (300.0, "kv_cache_usage", 300.0, "last_value", 0.5)


def test_a_short_history_is_not_backtested(tmp_path):
    with TraceLog(tmp_path / "t.duckdb") as log:
        for second in range(120):
            log.add("engine_stats", {"ts": 1.7e9 + second, "kv_cache_usage": 0.1})
        log.flush()
        service = ForecastService(log, None)
        result = service.reselect()
    assert result["selected"] is False and result["needed_s"] == 2400


@pytest.mark.parametrize("seconds,label", [(300, "5m"), (60, "1m"), (90, "90s")])
def test_horizon_labels(seconds, label):
    assert horizon_label(seconds) == label
