"""The live latency predictor and memory forecast on a real server (real engine):
every row carries its admission load and prediction, a retrain swaps the model only
when the candidate beats it (and says why either way, in its answer, /admin/models and
the trace log), and the forecast reaches /metrics."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from observe.tracelog import TraceLog
from serving.guard.live_predictor import QUEUE_VERSION
from slo.predict.accuracy import GATE_EVENT
from slo.predict.model import SEED_VERSION, seed_ttft_s
from tests.conftest import ADMIN_TOKEN, start_server, stop_server
from tests.test_model_services import _requests
from tests.test_serving import row_for, sample

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LOAD_COLUMNS = ("queue_depth", "running_requests", "kv_cache_usage", "recent_step_s",
                "pending_requests", "pending_prefill_tokens")


def _complete(server, model_name: str, words: int, max_tokens: int = 3) -> str:
    resp = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": model_name, "prompt": "word " * words, "max_tokens": max_tokens,
        "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    return resp.json()["id"].removeprefix("cmpl-")


def _models(server) -> dict:
    resp = httpx.get(server.url + "/admin/models", headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _retrain(server, name: str) -> dict:
    resp = httpx.post(server.url + f"/admin/models/{name}/retrain", headers=AUTH, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_a_row_carries_its_admission_load_and_the_queue_prediction(server, model_name):
    """No trained model yet: TTFT is the deadline check's queue estimate, calibrated
    online (never below the estimate's own median ratio times it), not the seed's."""
    assert _models(server)["latency"]["version"] == SEED_VERSION
    row = row_for(server, _complete(server, model_name, 300, max_tokens=5))
    for column in LOAD_COLUMNS:
        assert row[column] is not None and row[column] >= 0, column
    assert row["predictor_version"] == QUEUE_VERSION
    assert 0 < row["predicted_ttft_s"] <= row["predicted_ttft_p90_s"]
    assert row["estimated_ttft_s"] > 0
    assert row["predicted_ttft_s"] != pytest.approx(seed_ttft_s(row["prompt_tokens"]))
    assert row["predicted_e2e_s"] == pytest.approx(
        row["predicted_ttft_s"] + 4 * row["predicted_tpot_s"])


def test_concurrent_requests_see_each_other_as_pending(server, model_name):
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: _complete(server, model_name, 400, 8), range(8)))
    rows = [row_for(server, i) for i in ids]
    assert max(r["pending_requests"] for r in rows) >= 1
    assert max(r["pending_prefill_tokens"] for r in rows) >= 400


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A server (real engine) started on a trace file that already holds an hour of
    served requests whose latencies follow their prompt and load: what a retrain
    decides on them does not depend on how busy this machine is now."""
    tmp = tmp_path_factory.mktemp("recorded")
    with TraceLog(tmp / "trace.duckdb") as log:
        _requests(log, 600, start=time.time() - 3600)
    srv = start_server(tmp, "--retrain-interval", "0", "--reselect-interval", "0")
    yield srv
    stop_server(srv)


def test_a_retrain_that_beats_the_seed_swaps_the_live_model_and_saves_it(recorded):
    result = _retrain(recorded, "latency")
    assert result["trained"] is True and result["accepted"] is True, result
    assert result["reason"].startswith("accepted: TTFT p50 median APE "), result
    assert (result["live"]["version"], result["trigger"]) == (SEED_VERSION, "admin")
    assert result["candidate"]["version"] == result["version"]
    for target in ("ttft", "tpot"):  # the synthetic history is not the seed formula's
        key = f"{target}_p50_median_ape"
        assert result["candidate"][key] < result["live"][key] / 3, key
    assert (result["training_rows"], result["holdout_rows"]) == (480, 120)
    assert result["rows"] == 480 and result["version"].startswith("hgb-")
    assert _models(recorded)["latency"]["version"] == result["version"]
    assert Path(f"{recorded.db}.models", "latency.pkl").is_file()
    model_name = httpx.get(recorded.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    row = row_for(recorded, _complete(recorded, model_name, 200))
    assert row["predictor_version"] == result["version"]
    assert 0 < row["predicted_ttft_s"] < 60 and 0 < row["predicted_tpot_s"] < 60


def test_a_candidate_that_does_not_beat_the_live_model_is_refused(recorded):
    """Twice on the same rows: whatever the first retrain decides, the second candidate
    is the first's twin (same rows, same seed) and so no better than the model live
    after the first decision. The answer, /admin/models and the trace log say so."""
    first = _retrain(recorded, "latency")
    live = _models(recorded)["latency"]["version"]
    assert first["trained"] is True and first["version"] == live
    result = _retrain(recorded, "latency")
    assert result["trained"] is True and result["accepted"] is False, result
    assert result["reason"].startswith("refused: TTFT p50 median APE "), result
    assert result["version"] == result["live"]["version"] == live
    assert result["candidate"] == {**first["candidate"], "version": result["candidate"]["version"]}
    assert _models(recorded)["latency"]["version"] == live
    assert _models(recorded)["latency"]["last_retrain"]["reason"] == result["reason"]
    audit = recorded.sql(f"SELECT from_state, to_state, reason, details->>'$.trigger' AS "
                         f"trigger FROM policy_events WHERE policy = '{GATE_EVENT}' "
                         "ORDER BY ts DESC")
    assert audit[0] == {"from_state": live, "to_state": live, "reason": result["reason"],
                        "trigger": "admin"}
    assert audit[1]["to_state"] == live and audit[1]["reason"] == first["reason"]


def test_the_kv_cache_time_to_full_reaches_metrics(server):
    """The guard publishes it every tick: seconds to a full KV cache at its trend,
    capped at an hour (an idle server's cache is not rising)."""
    value = sample(server.metrics(), "tailguard_kv_cache_exhaustion_seconds")
    assert 0 <= value <= 3600


def test_the_memory_forecast_reaches_metrics_and_says_which_model(server):
    text = server.metrics()
    assert 'tailguard_memory_forecast_ratio{horizon="5m"' in text
    assert 0 <= sample(text, "tailguard_memory_forecast_ratio", horizon="5m") <= 1
    memory = _models(server)["memory"]
    assert memory["model"] == "last_value" and memory["backtest"] is None
    result = _retrain(server, "memory")  # minutes of history, not the 40 a backtest needs
    assert result["selected"] is False and result["needed_s"] == 2400


@pytest.mark.parametrize("method,path", [("GET", "/admin/models"),
                                         ("POST", "/admin/models/latency/retrain")])
def test_the_models_api_needs_the_token(server, method, path):
    assert httpx.request(method, server.url + path, timeout=10).status_code == 401


def test_an_unknown_model_is_a_404(server):
    resp = httpx.post(server.url + "/admin/models/nope/retrain", headers=AUTH, timeout=10)
    assert resp.status_code == 404 and "latency" in resp.json()["error"]["message"]
