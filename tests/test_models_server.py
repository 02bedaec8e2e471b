"""The live latency predictor and memory forecast on the session server (real engine):
every row carries its admission load and prediction, a retrain swaps the model, and
the forecast reaches /metrics."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from slo.predictor import MIN_ROWS, SEED_VERSION, seed_ttft_s
from tests.conftest import ADMIN_TOKEN
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


def test_a_row_carries_its_admission_load_and_the_seed_prediction(server, model_name):
    assert _models(server)["latency"]["version"] == SEED_VERSION
    row = row_for(server, _complete(server, model_name, 300, max_tokens=5))
    for column in LOAD_COLUMNS:
        assert row[column] is not None and row[column] >= 0, column
    assert row["predictor_version"] == SEED_VERSION
    assert row["predicted_ttft_s"] == pytest.approx(seed_ttft_s(row["prompt_tokens"]))
    assert row["predicted_e2e_s"] == pytest.approx(
        row["predicted_ttft_s"] + 4 * row["predicted_tpot_s"])


def test_concurrent_requests_see_each_other_as_pending(server, model_name):
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: _complete(server, model_name, 400, 8), range(8)))
    rows = [row_for(server, i) for i in ids]
    assert max(r["pending_requests"] for r in rows) >= 1
    assert max(r["pending_prefill_tokens"] for r in rows) >= 400


def test_a_retrain_swaps_the_live_model_and_saves_it(server, model_name):
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _complete(server, model_name, 20 + 37 * (i % 20)),
                      range(MIN_ROWS + 20)))
    result = _retrain(server, "latency")
    assert result["trained"] is True, result
    assert result["rows"] >= MIN_ROWS + 20 and result["version"].startswith("hgb-")
    assert _models(server)["latency"]["version"] == result["version"]
    assert Path(f"{server.db}.models", "latency.pkl").is_file()
    row = row_for(server, _complete(server, model_name, 200))
    assert row["predictor_version"] == result["version"]
    assert 0 < row["predicted_ttft_s"] < 60 and 0 < row["predicted_tpot_s"] < 60


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
