"""The server's predictor and forecaster services on a real trace-log file (no
engine): what they start with, when they refuse to retrain, and that a trained model
is saved and picked up by the next server."""

from __future__ import annotations

import math
import random
from datetime import datetime, timezone

import pytest

from observe.stats import AdmissionLoad, EngineSnapshot
from observe.tracelog import TraceLog
from serving.forecasting import ForecastService, horizon_label
from serving.prediction import PredictionService
from slo.predictor import MIN_ROWS, SEED_VERSION, seed_ttft_s

IDLE = AdmissionLoad(0, 0, 0.0, 0.0, 0, 0)


def _requests(log: TraceLog, n: int, start: float = 1.7e9) -> None:
    rng = random.Random(0)
    for i in range(n):
        prompt, pending = rng.randint(10, 4000), rng.randint(0, 8)
        ttft = (0.02 + 1e-4 * prompt + 0.01 * pending) * math.exp(rng.gauss(0, 0.05))
        log.add("requests", {
            "request_id": f"r{i}", "arrival_ts": start + i, "status": "ok",
            "prompt_tokens": prompt, "max_tokens": 32, "ttft_s": ttft, "tpot_s": 0.004,
            "queue_depth": 0, "running_requests": pending, "kv_cache_usage": 0.1,
            "recent_step_s": 0.01, "pending_requests": pending,
            "pending_prefill_tokens": 300 * pending, "priority": "realtime"})
    log.flush()


@pytest.mark.parametrize("prompt", [1, 500, 3000])
def test_the_seed_formula_predicts_until_a_model_is_trained(tmp_path, prompt):
    with TraceLog(tmp_path / "t.duckdb") as log:
        service = PredictionService(log, tmp_path / "m" / "latency.pkl")
        pred = service.predict(prompt, 10, IDLE, batch=False)
    assert pred.version == SEED_VERSION
    assert pred.ttft_s == pytest.approx(seed_ttft_s(prompt))
    assert pred.e2e_s == pytest.approx(pred.ttft_s + 9 * pred.tpot_s)


def test_too_few_requests_keep_the_current_model(tmp_path):
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, MIN_ROWS - 1, start=datetime.now(timezone.utc).timestamp() - 600)
        service = PredictionService(log, tmp_path / "latency.pkl")
        assert service.retrain() == {"trained": False, "rows": MIN_ROWS - 1, "needed": MIN_ROWS}
        assert service.model.version == SEED_VERSION


def test_a_trained_model_is_saved_and_loaded_by_the_next_server(tmp_path):
    path = tmp_path / "models" / "latency.pkl"
    with TraceLog(tmp_path / "t.duckdb") as log:
        _requests(log, 600, start=datetime.now(timezone.utc).timestamp() - 3600)
        first = PredictionService(log, path)
        result = first.retrain()
        assert result["trained"] is True and result["rows"] == 600
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
