"""The `tailguard` command: thin commands, one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from observe.tracelog import TraceLog
from tests.conftest import ADMIN_TOKEN, SESSION_SLO


def tailguard(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailguard", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "trace.duckdb"
    with TraceLog(str(path)) as log:
        for i, status in enumerate(["ok", "ok", "rejected"]):
            log.add("requests", {
                "request_id": f"r{i}", "status": status, "prompt_tokens": 10 * i,
                "arrival_ts": datetime(2026, 11, 30, 12, 0, i, tzinfo=timezone.utc),
                "e2e_s": 0.5 + i, "policy_actions": []})
    return path


def test_query_a_file_as_csv(trace_file):
    out = tailguard("query", "--db", str(trace_file), "--format", "csv",
                    "SELECT status, count(*) AS n FROM requests GROUP BY 1 ORDER BY 1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["status,n", "ok,2", "rejected,1"]


def test_query_a_file_as_json(trace_file):
    out = tailguard("query", "--db", str(trace_file), "--format", "json",
                    "SELECT request_id, arrival_ts FROM requests WHERE request_id = 'r1'")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["request_id"] == "r1"
    assert datetime.fromisoformat(rows[0]["arrival_ts"]) == \
        datetime(2026, 11, 30, 12, 0, 1, tzinfo=timezone.utc)


def test_query_as_a_table(trace_file):
    out = tailguard("query", "--db", str(trace_file), "SELECT request_id FROM requests ORDER BY 1")
    assert out.returncode == 0
    assert [line.strip() for line in out.stdout.splitlines()][2:5] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("args,needle", [
    (["query", "SELECT 1"], "exactly one of --db"),
    (["query", "--db", "x.duckdb", "--url", "http://127.0.0.1:1", "SELECT 1"], "exactly one"),
    (["query", "--db", "/nonexistent/t.duckdb", "SELECT 1"], "no such trace log"),
    (["query", "--format", "xml", "--db", "t", "SELECT 1"], "xml"),
    (["serve", "--port", "0"], "0"),
    (["serve", "--model", "/nonexistent"], "/nonexistent"),
    (["no-such-command"], "no-such-command"),
    (["console", "--slo", str(SESSION_SLO)], "--slo goes with --db"),
    (["console", "--db", "/nonexistent/t.duckdb"], "/nonexistent"),
    (["console", "--refresh", "999"], "999"),
    (["serve", "--otlp-protocol", "grpc"], "--otlp-protocol needs --otlp-endpoint"),
    (["serve", "--archive-after", "30d"], "go with --archive-dir"),
    (["serve", "--otlp-endpoint", "ftp://x"], "ftp://x"),
    (["serve", "--native-histograms", "--otlp-endpoint", "http://127.0.0.1:1"],
     "--native-histograms needs Prometheus as the only metrics reader"),
])
def test_bad_arguments_exit_2_with_one_line(args, needle):
    out = tailguard(*args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_writes_are_refused_with_one_line(trace_file):
    out = tailguard("query", "--db", str(trace_file), "DELETE FROM requests")
    assert out.returncode == 2 and "SELECT" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_file_held_by_the_server_points_to_url(server):
    out = tailguard("query", "--db", str(server.db), "SELECT 1")
    assert out.returncode == 2 and "--url" in out.stderr


def test_query_through_the_server(server, client, model_name):
    client.completions.create(model=model_name, prompt="via url", max_tokens=2)
    server.admin("/admin/flush")
    out = tailguard("query", "--url", server.url, "--format", "csv",
                    "SELECT count(*) > 0 AS any FROM requests WHERE status = 'ok'",
                    env={"TAILGUARD_ADMIN_TOKEN": ADMIN_TOKEN})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["any", "true"]


def test_query_through_the_server_says_when_the_answer_size_cut_it(server):
    out = tailguard("query", "--url", server.url, "--format", "csv", "--max-rows", "100000",
                    "SELECT repeat('x', 10000) AS wide FROM range(100000)",
                    env={"TAILGUARD_ADMIN_TOKEN": ADMIN_TOKEN})
    assert out.returncode == 0, out.stderr
    rows = len(out.stdout.splitlines()) - 1
    assert 0 < rows < 100000
    assert out.stderr.strip() == f"(truncated to {rows} rows: the server's answer size limit)"


def test_the_admin_api_needs_the_token(server):
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as err:
        server.admin("/admin/query", {"sql": "SELECT 1"}, token="wrong")
    assert err.value.code == 401


def test_model_init_builds_once_then_reuses(tmp_path):
    target = tmp_path / "model"
    first = tailguard("model", "init", str(target))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == str(target)
    stamp = target / "tailguard-model.json"
    built_at = stamp.stat().st_mtime_ns
    again = tailguard("model", "init", str(target))
    assert again.returncode == 0 and stamp.stat().st_mtime_ns == built_at
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in (target / "chat_template.jinja").read_text()
    assert tokenizer["eos_token"] == "<|im_end|>"


def test_model_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert tailguard("model", "init", str(a)).returncode == 0
    assert tailguard("model", "init", str(b)).returncode == 0
    for name in ("model.safetensors", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_serve_refuses_a_bad_slo_spec_with_its_line(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("slos:\n  - name: x\n    sli: ttft\n    objective: 2\n")
    out = tailguard("serve", "--slo", str(spec))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert f"{spec}:4: slos[0].objective" in out.stderr


@pytest.mark.parametrize("option,text,needle", [
    ("--policies", "breaker_off_model: 2.0\nbreaker_off_model_clear: 2.5\n",
     "breaker_off_model_clear must not exceed breaker_off_model"),
    ("--policies", "brekaer_p99_s: 1.0\n", "unknown field(s) brekaer_p99_s"),
    ("--keys", "keys:\n  - name: a\n    key: sk-a\n    tier: gold\n",
     "bad.yaml:4: keys[0].tier"),
])
def test_serve_refuses_bad_policies_and_keys_with_one_line(tmp_path, option, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = tailguard("serve", option, str(path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert needle in out.stderr
    assert "sk-a" not in out.stderr  # a key never appears in an error


def test_slo_status_on_a_file(trace_file):
    out = tailguard("slo", "status", "--db", str(trace_file), "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    names = [s["name"] for s in data["slos"] if not s["group"]]
    assert names == ["ttft", "first_token_health", "tpot", "e2e", "availability", "error_rate"]


def test_every_serve_option_is_named_after_the_config_field_it_sets():
    from dataclasses import fields

    from serving.config import ServerConfig
    from tailguard.commands import serve

    settable = {f.name for f in fields(ServerConfig) if f.init}
    assert {p.name for p in serve.params} <= settable


def test_serve_hands_each_option_to_its_config_field(tmp_path, monkeypatch):
    """Every option reaches ServerConfig unchanged (the server itself is stubbed out)."""
    import types

    from click.testing import CliRunner

    from tailguard.cli import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    seen = []
    monkeypatch.setitem(sys.modules, "serving.server", types.SimpleNamespace(run=seen.append))
    result = CliRunner().invoke(main, [
        "serve", "--model", str(model), "--served-model-name", "m", "--port", "8123",
        "--db", str(tmp_path / "t.duckdb"), "--flush-interval", "2", "--retrain-interval", "0",
        "--reselect-interval", "7", "--max-body-bytes", "2048", "--archive-dir",
        str(tmp_path / "archive"), "--archive-after", "2d", "--archive-interval", "60",
        "--instance", "a", "--forwarded-allow-ips", "*", "--", "--max-num-seqs", "4"])
    assert result.exit_code == 0, result.output
    (config,) = seen
    assert (config.model, config.served_model_name, config.port) == (str(model), "m", 8123)
    assert (config.flush_interval_s, config.retrain_interval_s, config.reselect_interval_s,
            config.max_body_bytes) == (2.0, 0.0, 7.0, 2048)
    assert (config.archive.retention_s, config.archive.interval_s, config.archive.instance) \
        == (2 * 86400, 60.0, "a")
    assert (config.forwarded_allow_ips, config.vllm_args) == ("*", ["--max-num-seqs", "4"])
