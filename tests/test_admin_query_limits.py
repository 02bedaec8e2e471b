"""`POST /admin/query` cannot starve the server: at most two user queries at once (429
with Retry-After beyond), the trace log keeps landing and /v1 keeps its latency while
they run, and an answer is bounded in bytes, built off the event loop and streamed.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import httpx
import pytest

from serving.admin.query import (
    DEFAULT_QUERY_BYTES,
    MAX_QUERY_BYTES,
    AdminQueryConfig,
    encode_answer,
    parse_query_body,
)
from serving.errors import ApiError
from tests.conftest import ADMIN_TOKEN

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# A cross join over the requests table that only the 10 s timeout ends.
HEAVY_SQL = ("SELECT count(*) FROM requests a, requests b, range(1000000000) r "
             "WHERE a.e2e_s + b.e2e_s + r.range < -1")
WIDE_SQL = "SELECT repeat('x', 10000) FROM range(100000)"


# --- the answer, unit by unit -----------------------------------------------------------

def answer(sql: str, max_rows: int = 100, max_bytes: int = DEFAULT_QUERY_BYTES) -> dict:
    conn = duckdb.connect(":memory:")
    conn.execute(sql)
    return json.loads(b"".join(encode_answer(conn, max_rows, max_bytes)))


def test_an_answer_holds_columns_rows_and_says_it_is_whole():
    assert answer("SELECT range AS n, 'a' AS s FROM range(3)") == {
        "columns": ["n", "s"], "rows": [[0, "a"], [1, "a"], [2, "a"]],
        "truncated": False, "truncated_by": None}


def test_an_answer_stops_at_max_rows_and_says_so():
    got = answer("SELECT * FROM range(10)", max_rows=4)
    assert (got["rows"], got["truncated"], got["truncated_by"]) == \
        ([[0], [1], [2], [3]], True, "max_rows")
    assert answer("SELECT * FROM range(4)", max_rows=4)["truncated"] is False


@pytest.mark.parametrize("max_bytes", [1024, 5000, 100_000])
def test_an_answer_stops_before_max_bytes_and_says_so(max_bytes):
    conn = duckdb.connect(":memory:")
    conn.execute("SELECT range, repeat('x', 100) FROM range(10000)")
    body = b"".join(encode_answer(conn, 100_000, max_bytes))
    got = json.loads(body)
    assert len(body) <= max_bytes
    assert got["truncated"] is True and got["truncated_by"] == "max_bytes"
    assert [row[0] for row in got["rows"]] == list(range(len(got["rows"])))
    assert len(body) > max_bytes - 200  # filled up to the bound, not far below it


def test_an_answer_carries_timestamps_json_text_and_non_finite_floats():
    got = answer("SELECT TIMESTAMPTZ '2026-01-02 03:04:05+00' AS t, '{\"a\":1}'::JSON AS j, "
                 "'nan'::DOUBLE AS n, 'inf'::DOUBLE AS i, [1, 2] AS l")
    assert got["rows"] == [["2026-01-02T03:04:05+00:00", '{"a":1}', "NaN", "Infinity", [1, 2]]]


@pytest.mark.parametrize("body, error", [
    ({"sql": "SELECT 1", "max_bytes": 100}, "max_bytes must be an integer in 1024.."),
    ({"sql": "SELECT 1", "max_bytes": MAX_QUERY_BYTES + 1}, "max_bytes"),
    ({"sql": "SELECT 1", "max_bytes": True}, "max_bytes"),
    ({"sql": "SELECT 1", "max_rows": 0}, "max_rows must be an integer in 1..100000"),
    ({"sql": " "}, "body must be"),
])
def test_query_bodies_out_of_bounds_are_refused(body, error):
    with pytest.raises(ApiError, match=error):
        parse_query_body(body)


@pytest.mark.parametrize("env, slots", [("", 2), ("5", 5)])
def test_query_slots_resolve_argument_env_default(monkeypatch, env, slots):
    monkeypatch.setenv("TAILGUARD_ADMIN_QUERY_SLOTS", env)
    assert AdminQueryConfig().slots == slots
    assert AdminQueryConfig(slots=3).slots == 3
    with pytest.raises(ValueError, match="slots must be >= 1"):
        AdminQueryConfig(slots=0)


# --- against the server -----------------------------------------------------------------

def complete(server, model_name) -> float:
    started = time.perf_counter()
    response = httpx.post(server.url + "/v1/completions", timeout=120, json={
        "model": model_name, "prompt": "The trace log", "max_tokens": 8})
    assert response.status_code == 200, response.text[:200]
    return time.perf_counter() - started


def rows_written(server) -> int:
    """Request rows durable: in DuckDB, or in the spool on their way there."""
    stats = httpx.get(server.url + "/admin/tracelog", headers=AUTH, timeout=30).json()
    return stats["rows_written"]["requests"] + stats["rows_spooled"]["requests"]


def landing_lag(server, model_name) -> tuple[float, float]:
    """(latency of one completion, seconds from its answer until its row is written)."""
    before = rows_written(server)
    latency = complete(server, model_name)
    answered = time.perf_counter()
    while rows_written(server) <= before:
        assert time.perf_counter() - answered < 10, "the trace row never landed"
        time.sleep(0.02)
    return latency, time.perf_counter() - answered


def post_query(server, sql: str, **extra) -> httpx.Response:
    return httpx.post(server.url + "/admin/query", headers=AUTH, timeout=60,
                      json={"sql": sql, **extra})


def test_two_heavy_queries_run_the_rest_get_429_and_serving_goes_on(server, model_name):
    for _ in range(4):  # rows to cross-join, and a warm engine
        complete(server, model_name)
    baseline = [landing_lag(server, model_name) for _ in range(5)]
    with ThreadPoolExecutor(4) as pool:
        heavy = [pool.submit(post_query, server, HEAVY_SQL) for _ in range(4)]
        time.sleep(1.0)  # the two admitted queries are running now
        during = [landing_lag(server, model_name) for _ in range(5)]
        slo = httpx.get(server.url + "/admin/slo", headers=AUTH, timeout=60)
        answers = [f.result() for f in heavy]
    busy = [a for a in answers if a.status_code == 429]
    assert len(busy) == 2, [(a.status_code, a.text[:100]) for a in answers]
    assert all(a.headers.get("retry-after") == "1" for a in busy)
    assert all("retry" in a.json()["error"]["message"] for a in busy)
    ran = [a for a in answers if a.status_code != 429]
    assert all("timed out after 10s" in a.json()["error"]["message"] for a in ran), \
        [a.text[:200] for a in ran]
    assert slo.status_code == 200  # the server's own readers never wait for a slot
    base_latency = statistics.median(lat for lat, _ in baseline)
    latency = statistics.median(lat for lat, _ in during)
    print(f"\n/v1 latency median {base_latency:.3f}s alone, {latency:.3f}s beside two "
          f"heavy queries; trace-row lag max {max(lag for _, lag in baseline):.3f}s alone, "
          f"{max(lag for _, lag in during):.3f}s beside")
    assert max(lag for _, lag in during) <= 1.0
    assert latency < 2 * base_latency + 0.5
    assert post_query(server, "SELECT 1 AS one").json()["rows"] == [[1]]  # slots are back


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_wide_answer_is_cut_at_max_bytes_without_bloating_the_server(server, model_name):
    pid = server.process.pid
    base_latency = statistics.median(complete(server, model_name) for _ in range(3))
    before, peak, stop = vm_rss(pid), [vm_rss(pid)], threading.Event()

    def sample():
        while not stop.wait(0.02):
            peak.append(vm_rss(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            started = time.perf_counter()
            wide = pool.submit(post_query, server, WIDE_SQL, max_rows=100_000)
            time.sleep(0.2)
            latency = complete(server, model_name)
            response = wide.result()
            took = time.perf_counter() - started
    finally:
        stop.set()
        sampler.join()
    body = response.content
    got = json.loads(body)
    growth = max(peak) - before
    print(f"\nwide answer: {len(body)} bytes, {len(got['rows'])} rows in {took:.2f}s; server "
          f"RSS +{growth / 2**20:.0f} MiB at peak; /v1 {latency:.3f}s beside "
          f"(alone {base_latency:.3f}s)")
    assert response.status_code == 200
    assert got["truncated"] is True and got["truncated_by"] == "max_bytes"
    assert len(body) <= DEFAULT_QUERY_BYTES and len(got["rows"]) > 1000
    assert took < 10
    assert growth < 200 * 2**20
    assert latency < 2 * base_latency + 1.0
