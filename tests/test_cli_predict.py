"""`tailguard predict` and `tailguard forecast` on recorded trace-log files.

Run in-process with click's CliRunner (through `tailguard.cli.main`, so usage errors
still go through the one-line, exit-code-2 path). The forecast commands run with a
small LSTM in place of the default one: the default (window 60, hidden 32, up to 150
epochs) needed over 7 minutes for one `forecast eval` on this file on a busy 2-core
machine, while the small one still takes the real fitting and backtest path.
"""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from observe.tracelog import TraceLog
from slo.forecast.forecaster import load_forecaster
from slo.forecast.series import Series
from slo.predict.model import MIN_ROWS, load_model

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
REQUESTS = 600
SECONDS = 3000
SERVED_BY_SEED = 400  # the first 400 rows were predicted by the seed, the rest by "hgb-test"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One OpenMP/torch thread: with the default thread counts, contention on a busy
    2-core box made one `predict train` take 20 s instead of under 2."""
    import sklearn.ensemble  # noqa: F401  (loads the OpenMP runtime the limit applies to)
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def small_lstm(monkeypatch):
    from slo.forecast import lstm

    monkeypatch.setattr(lstm, "LSTMForecaster",
                        functools.partial(lstm.LSTMForecaster, window=12, hidden=8, epochs=3))


def tailguard(*args: str):
    from tailguard.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=True)


def ok(result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def usage_error(result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tailguard: error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def _request(i: int, rng: np.random.Generator) -> dict:
    prompt = int(rng.integers(16, 4000))
    pending = int(rng.integers(0, 20))
    running = int(rng.integers(1, 16))
    ttft = (0.02 + 1e-4 * prompt + 0.01 * pending) * math.exp(rng.normal(0, 0.05))
    tpot = None if i % 50 == 7 else (0.004 + 0.001 * running) * math.exp(rng.normal(0, 0.05))
    seed = i < SERVED_BY_SEED
    return {
        "request_id": f"r{i}", "status": "ok", "priority": "batch" if i % 5 == 0 else "realtime",
        "arrival_ts": T0 + 5 * i, "prompt_tokens": prompt, "max_tokens": 128,
        "queue_depth": pending, "running_requests": running, "kv_cache_usage": 0.3,
        "recent_step_s": 0.01, "pending_requests": pending,
        "pending_prefill_tokens": 100 * pending, "tokenize_s": 0.001,
        "ttft_s": ttft, "tpot_s": tpot,
        # As served: the seed doubled every TTFT and halved every TPOT; "hgb-test" was exact.
        "predicted_ttft_s": 2 * ttft if seed else ttft,
        "predicted_ttft_p90_s": 2 * ttft if seed else ttft,
        "predicted_tpot_s": None if tpot is None else (tpot / 2 if seed else tpot),
        "predicted_tpot_p90_s": None if tpot is None else (tpot / 2 if seed else tpot),
        "predictor_version": "seed-003" if seed else "hgb-test"}


def kv_at(second: int) -> float:
    return 0.5 + 0.3 * math.sin(2 * math.pi * second / 300)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("predict") / "trace.duckdb"
    rng = np.random.default_rng(7)
    with TraceLog(str(path)) as log:
        for i in range(REQUESTS):
            log.add("requests", _request(i, rng))
        # Not training rows: refused, or logged before the load columns existed.
        log.add("requests", {"request_id": "x1", "status": "rejected", "arrival_ts": T0,
                             "queue_depth": 3, "ttft_s": 0.1})
        log.add("requests", {"request_id": "x2", "status": "ok", "arrival_ts": T0,
                             "ttft_s": 0.1, "prompt_tokens": 10})
        for s in range(SECONDS):
            log.add("engine_stats", {
                "ts": T0 + s, "kv_cache_usage": kv_at(s) + rng.normal(0, 0.01),
                "running": 4 + int(8 * kv_at(s + 20)), "waiting": int(rng.integers(0, 3)),
                "prompt_tokens": 100, "generation_tokens": 50, "finished": 1,
                "preemptions": 0, "rss_bytes": 10**9 + s})
    return path


@pytest.fixture(scope="module")
def few_rows(tmp_path_factory):
    """Too few requests to train on, and no engine statistics."""
    path = tmp_path_factory.mktemp("few") / "trace.duckdb"
    rng = np.random.default_rng(8)
    with TraceLog(str(path)) as log:
        for i in range(MIN_ROWS // 4):
            log.add("requests", _request(i, rng))
    return path


@pytest.fixture(scope="module")
def trained(trace_file):
    """`predict train` once; later tests read what it printed and wrote."""
    from tailguard.cli import main

    return CliRunner().invoke(main, ["predict", "train", "--db", str(trace_file)])


# --- predict -------------------------------------------------------------------------

def test_predict_train_prints_accuracy_and_writes_the_model(trace_file, trained):
    out = ok(trained)
    path = trace_file.parent / "trace.duckdb.models" / "latency.pkl"
    model = load_model(path)
    assert model.rows == 420  # 600 served rows, the newest 30% held out
    assert model.window == (T0, T0 + 5 * 419)
    assert out.splitlines()[0] == f"trained {model.version} on 420 requests -> {path}"
    assert "held-out requests: 180" in out
    table = {tuple(line.split()[:3]) for line in out.splitlines()}
    for target, requests in [("ttft_s", "180"), ("tpot_s", str(180 - 180 // 50))]:
        assert ("seed-003", target, requests) in table
        assert (model.version, target, requests) in table
    ratios = dict(re.findall(r"(\w+_s) ([\d.]+)x", out.splitlines()[-1]))
    assert set(ratios) == {"ttft_s", "tpot_s"}
    assert all(float(r) >= 2 for r in ratios.values()), ratios


def test_predict_train_with_no_holdout_and_another_file(trace_file, tmp_path):
    out_file = tmp_path / "elsewhere" / "m.pkl"
    out = ok(tailguard("predict", "train", "--db", str(trace_file), "--holdout", "0",
                       "--out", str(out_file)))
    model = load_model(out_file)
    assert out == f"trained {model.version} on {REQUESTS} requests -> {out_file}\n"


def _served_rows(out: str) -> list[list[str]]:
    rows = [line.split() for line in out.split(SERVED_HEADING)[1].splitlines()]
    assert rows[0] == ["model", "requests", "ttft_mape", "ttft_p90_coverage", "tpot_mape",
                       "tpot_p90_coverage"]
    return rows[2:]


SERVED_HEADING = "\nas served (the rows' own predictions):\n"


def test_predict_eval_judges_the_saved_model_and_what_was_served(trace_file, trained):
    ok(trained)
    out = ok(tailguard("predict", "eval", "--db", str(trace_file)))
    model = load_model(trace_file.parent / "trace.duckdb.models" / "latency.pkl")
    before = out.split(SERVED_HEADING)[0]
    assert before.splitlines()[0] == "held-out requests: 180"
    assert any(line.split()[:2] == [model.version, "ttft_s"] for line in before.splitlines())
    assert "seed-003" in before
    served = _served_rows(out)
    assert served[0] == ["seed-003", "400", "1.0", "1.0", "0.5", "0.0"]
    assert served[1][:5] == ["hgb-test", "200", "0.0", "1.0", "0.0"]
    assert served[2] == ["(2", "rows)"]


def test_served_tpot_coverage_ignores_requests_without_a_tpot(trace_file, trained):
    ok(trained)
    served = _served_rows(ok(tailguard("predict", "eval", "--db", str(trace_file))))
    assert served[1] == ["hgb-test", "200", "0.0", "1.0", "0.0", "1.0"]


def test_predict_eval_on_every_request(trace_file, trained):
    ok(trained)
    out = ok(tailguard("predict", "eval", "--db", str(trace_file), "--holdout", "1"))
    assert out.splitlines()[0] == f"held-out requests: {REQUESTS}"


# --- forecast ------------------------------------------------------------------------

def test_forecast_eval_backtests_every_model(trace_file):
    out = ok(tailguard("forecast", "eval", "--db", str(trace_file), "--step", "5",
                       "--horizon", "60"))
    lines = out.splitlines()
    # 3000 s in 5 s steps: 600 steps, 360 before the first origin, 12 steps ahead.
    assert lines[0] == ("kv_cache_usage, 60 s ahead, 5 s steps, 228 origins after 360 "
                        "training steps")
    names = [line.split()[0] for line in lines[2:-1]]
    assert sorted(names) == ["ets", "ewma", "last_value", "lstm", "ridge_lags"]
    assert lines[-1].startswith(f"winner: {names[0]} (")


def test_forecast_eval_as_json(trace_file):
    out = ok(tailguard("forecast", "eval", "--db", str(trace_file), "--step", "10",
                       "--horizon", "300", "--target", "rss_bytes", "--train-share", "0.5",
                       "--json"))
    result = json.loads(out)
    assert (result["target"], result["step_s"], result["horizon_s"]) == ("rss_bytes", 10.0, 300.0)
    assert result["train_steps"] == 150
    assert {s["origins"] for s in result["scores"]} == {300 - 150 - 30}
    maes = [s["mae"] for s in result["scores"]]
    assert maes == sorted(maes) and result["winner"] == result["scores"][0]["name"]


def test_forecast_eval_seed_sets_the_lstm_members_seeds(trace_file):
    from slo.forecast.backtest import all_forecasters

    lstm = all_forecasters(7)[-1]
    assert (lstm.name, lstm.seed) == ("lstm", 7) and all_forecasters()[-1].seed == 0
    line = usage_error(tailguard("forecast", "eval", "--db", str(trace_file), "--seed", "-1"))
    assert "--seed" in line


def test_forecast_train_saves_the_winner(trace_file):
    out = ok(tailguard("forecast", "train", "--db", str(trace_file), "--step", "5",
                       "--horizon", "60"))
    path = trace_file.parent / "trace.duckdb.models" / "memory-forecast.pkl"
    chosen = load_forecaster(path)
    assert out.splitlines()[-1] == f"saved {chosen.model.name} -> {path}"
    assert f"winner: {chosen.model.name}" in out
    assert (chosen.target, chosen.horizon_s, chosen.step_s) == ("kv_cache_usage", 60.0, 5.0)
    series = Series.from_rows(
        [(T0 + s, kv_at(s), 1e9, 4, 1, 100, 50, 1, 0) for s in range(SECONDS)], 5.0)
    assert 0.0 <= chosen.forecast_latest(series) <= 1.0


# --- usage errors --------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ["predict", "train"], ["predict", "eval", "--model", "{model}"], ["forecast", "eval"],
    ["forecast", "train"]])
def test_a_missing_trace_file_is_one_line(tmp_path, trace_file, trained, command):
    ok(trained)
    model = str(trace_file.parent / "trace.duckdb.models" / "latency.pkl")
    args = [a.replace("{model}", model) for a in command]
    line = usage_error(tailguard(*args, "--db", str(tmp_path / "missing.duckdb")))
    assert "no trace log at" in line and "missing.duckdb" in line


def test_predict_eval_without_a_model_is_one_line(few_rows):
    line = usage_error(tailguard("predict", "eval", "--db", str(few_rows)))
    assert "latency.pkl" in line


@pytest.mark.parametrize("content,needle", [
    (b"", "not a readable model file"), (b"garbage", "not a readable model file"),
    (None, "not a tailguard latency model")])
def test_predict_eval_with_a_file_that_is_no_model_is_one_line(tmp_path, few_rows, content,
                                                               needle):
    path = tmp_path / "m.pkl"
    if content is None:
        from slo import model_files

        model_files.save({"weights": []}, path, "memory forecaster", 1)
    else:
        path.write_bytes(content)
    line = usage_error(tailguard("predict", "eval", "--db", str(few_rows), "--model", str(path)))
    assert needle in line


def test_predict_train_on_too_few_requests_is_one_line(few_rows):
    line = usage_error(tailguard("predict", "train", "--db", str(few_rows)))
    assert f"need at least {MIN_ROWS} served requests to train, have 35" in line
    assert not (few_rows.parent / "trace.duckdb.models").exists()


@pytest.mark.parametrize("command", [["forecast", "eval"], ["forecast", "train"]])
def test_forecast_without_engine_stats_is_one_line(few_rows, command):
    line = usage_error(tailguard(*command, "--db", str(few_rows)))
    assert "no engine_stats rows" in line


@pytest.mark.parametrize("command,horizon,needle", [
    ("eval", "2000", "too short to backtest"), ("train", "2000", "too short to backtest"),
    ("eval", "2", "at least one step")])
def test_a_horizon_the_series_cannot_serve_is_one_line(trace_file, command, horizon, needle):
    line = usage_error(tailguard("forecast", command, "--db", str(trace_file), "--horizon",
                                 horizon))
    assert needle in line


@pytest.mark.parametrize("args,needle", [
    (["predict", "train", "--holdout", "0.95"], "holdout"),
    (["forecast", "eval", "--step", "0.1"], "step"),
    (["forecast", "eval", "--target", "gpu_temp"], "gpu_temp"),
    (["predict", "train"], "--db")])
def test_bad_options_are_one_line(trace_file, args, needle):
    if needle != "--db":
        args = [*args, "--db", str(trace_file)]
    assert needle in usage_error(tailguard(*args))


# --- without PyTorch -------------------------------------------------------------------

# `tailguard` as a user without torch runs it: importing torch fails as for a package
# never installed (a finder, not sys.modules["torch"] = None, which breaks scipy's own
# "is torch loaded?" checks and so every sklearn import).
NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoTorch())
from tailguard.cli import main
sys.argv[0] = "tailguard"
main()
"""


def without_torch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("command", [["forecast", "eval"], ["forecast", "train"]])
def test_forecast_without_torch_names_the_extra_in_one_line(trace_file, command):
    done = without_torch(*command, "--db", str(trace_file))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("tailguard: error: tailguard forecast needs PyTorch for its LSTM: "
                           "pip install 'tailguard[forecast]'\n")


def test_predict_needs_no_torch(trace_file, tmp_path):
    done = without_torch("predict", "train", "--db", str(trace_file), "--out",
                         str(tmp_path / "latency.pkl"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_model(tmp_path / "latency.pkl").version.startswith("hgb-")


def test_the_forecast_extra_declares_torch():
    import tomllib
    from pathlib import Path

    from tailguard.cmd_predict import FORECAST_EXTRA

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = FORECAST_EXTRA.removeprefix("tailguard[").removesuffix("]")
    assert [d for d in project["project"]["optional-dependencies"][extra]
            if d.startswith("torch")] == ["torch>=2.1"]
