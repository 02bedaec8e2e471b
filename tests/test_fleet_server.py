"""Beyond one machine, on a real server: its spans and metrics reach an OTLP collector
(a local receiver that decodes them) beside the DuckDB log, its trace log rotates into
the Parquet archive that `tailguard query --archive` reads, and its server and engine
processes push CPU profiles to a Pyroscope receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from unittest import mock

import httpx
import pytest

from observe import registry as R
from serving.profiling import PHASES, PROCESS_ENGINE, PROCESS_SERVER
from tests.conftest import ADMIN_TOKEN, start_server, stop_server
from tests.otlp_receiver import HttpReceiver
from tests.pyroscope_receiver import PyroscopeReceiver

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
INSTANCE = "node-a"
# Export fast enough for a test: metrics every second, spans batched for 200 ms.
FAST_EXPORT = {"OTEL_METRIC_EXPORT_INTERVAL": "1000", "OTEL_BSP_SCHEDULE_DELAY": "200"}


@pytest.fixture(scope="module")
def collector():
    with HttpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def profiles():
    with PyroscopeReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, collector, profiles):
    tmp = tmp_path_factory.mktemp("fleet")
    with mock.patch.dict(os.environ, FAST_EXPORT):
        srv = start_server(tmp, "--otlp-endpoint", collector.endpoint, "--archive-dir",
                           str(tmp / "archive"), "--instance", INSTANCE,
                           "--profile-server", profiles.url,
                           "--retrain-interval", "0", "--reselect-interval", "0")
    srv.archive = tmp / "archive"
    yield srv
    stop_server(srv)


def complete(srv, text: str, max_tokens: int = 4) -> str:
    resp = httpx.post(srv.url + "/v1/completions", timeout=120, json={
        "model": "tailguard-tiny-llama", "prompt": text, "max_tokens": max_tokens})
    assert resp.status_code == 200, resp.text
    return resp.headers["x-request-id"]


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout} s")


def test_spans_and_metrics_reach_the_collector_beside_the_trace_log(fleet, collector):
    ids = {complete(fleet, f"collector {i}") for i in range(3)}

    def request_spans():
        seen = [s for s in collector.spans() if s.name == R.SPAN_REQUEST
                and s.attributes.get(R.ATTR_REQUEST_ID) in ids]
        return seen if len(seen) == 3 else None

    spans = wait_for(request_spans)
    assert {s.resource["service.name"] for s in spans} == {"tailguard"}
    # the same span ids as the trace log's rows: one trace, two sinks
    fleet.admin("/admin/flush")
    logged = fleet.admin("/admin/query", {"sql": "SELECT span_id FROM spans WHERE name = "
                                          f"'{R.SPAN_REQUEST}' AND request_id IN "
                                          f"({', '.join(repr(i) for i in ids)})"})
    assert {row[0] for row in logged["rows"]} == {s.span_id for s in spans}
    phases = {s.name for s in collector.spans() if s.attributes.get(R.ATTR_REQUEST_ID) in ids}
    assert {R.SPAN_QUEUE, R.SPAN_PREFILL, R.SPAN_DECODE} <= phases

    def requests_counted():
        points = collector.last_points(R.REQUESTS.otel_name)
        ok = sum(p.value for p in points if p.attributes.get(R.LABEL_STATUS) == "ok")
        return ok >= 3 and points

    points = wait_for(requests_counted)
    assert points[0].resource["service.name"] == "tailguard" and points[0].monotonic


def test_the_trace_log_rotates_into_the_archive_and_reads_back(fleet):
    ids = {complete(fleet, f"archive {i}") for i in range(2)}
    moved = httpx.post(fleet.url + "/admin/archive", headers=AUTH, timeout=60,
                       json={"older_than_s": 0}).json()
    assert moved["instance"] == INSTANCE and moved["archived"]["requests"] >= 2
    live = fleet.sql("SELECT count(*) AS n FROM requests")
    assert live == [{"n": 0}]  # everything older than now went to Parquet
    out = subprocess.run(
        [sys.executable, "-m", "tailguard", "query", "--archive", str(fleet.archive),
         "--format", "json", "SELECT request_id, instance FROM requests"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert ids <= {r["request_id"] for r in rows}
    assert {r["instance"] for r in rows} == {INSTANCE}
    parts = list((fleet.archive / "requests").glob("date=*/instance=node-a/*.parquet"))
    assert parts


def test_server_and_engine_push_profiles_tagged_by_phase(fleet, profiles):
    for i in range(6):
        complete(fleet, "profile the engine " * (40 * (i + 1)), max_tokens=32)

    def both_processes(rx) -> bool:
        seen = {p.labels.get("process") for p in rx.pushes}
        return {PROCESS_SERVER, PROCESS_ENGINE} <= seen and bool(
            [s for s in rx.samples() if s.labels.get("phase")])

    assert profiles.wait_for(both_processes, timeout_s=60), [p.labels for p in profiles.pushes]
    push = next(p for p in profiles.pushes if p.labels.get("process") == PROCESS_ENGINE)
    assert push.labels["service_name"] == "tailguard"
    assert push.labels["model"] == "tailguard-tiny-llama"
    tagged = [s for s in profiles.samples() if s.labels.get("phase")]
    assert {s.labels["phase"] for s in tagged} <= set(PHASES)
    # pyroscope-io sets a thread's tags one at a time (phase, then context_bucket), so
    # a sample taken in between carries the phase alone: rare, and not ours to close
    both = [s for s in tagged if "context_bucket" in s.labels]
    assert both and {s.labels["context_bucket"] for s in both} <= set(R.CONTEXT_BUCKETS)


@pytest.mark.parametrize("body,code", [({"older_than_s": -1}, "invalid_request"),
                                       ({"older_than_s": "soon"}, "invalid_request")])
def test_a_bad_archive_request_is_400(fleet, body, code):
    resp = httpx.post(fleet.url + "/admin/archive", headers=AUTH, json=body, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == code


def test_archiving_without_an_archive_dir_is_409(server):
    resp = httpx.post(server.url + "/admin/archive", headers=AUTH, json={}, timeout=30)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "archive_off"
