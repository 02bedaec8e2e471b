"""The trace-log writer, its schema and the read-only query helpers, on real DuckDB files."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pytest

from observe.query import (
    QueryError,
    QueryResult,
    check_read_only,
    format_result,
    query_file,
)
from observe.schema import REQUESTS, TABLES, create_schema
from observe.settings import TAILGUARD_TRACE_FLUSH_S as FLUSH_INTERVAL_ENV
from observe.settings import TAILGUARD_TRACE_MEMORY as MEMORY_LIMIT_ENV
from observe.tracelog import TraceLog
from observe.tracelog.setup import DEFAULT_MEMORY_LIMIT, LOAD_ROWS, TraceLogConfig

UTC = timezone.utc
ARRIVAL = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
# What DESCRIBE reports for each declared type.
DESCRIBED = {"TIMESTAMPTZ": "TIMESTAMP WITH TIME ZONE"}

FULL_REQUEST = {
    "request_id": "req-1", "trace_id": "0af7651916cd43dd8448eb211c80319c",
    "arrival_ts": ARRIVAL, "model": "tiny-llama", "endpoint": "/v1/chat/completions",
    "stream": True, "priority": "realtime", "status": "error", "http_status": 503,
    "error_type": "overloaded", "error_message": "shed by policy", "finish_reason": "length",
    "prompt_tokens": 1500, "output_tokens": 64, "max_tokens": 128,
    "context_bucket": "1k-4k", "batch_bucket": "0-256", "queue_s": 0.125, "prefill_s": 0.25,
    "decode_s": 1.5, "sampling_s": 0.0625, "ttft_s": 0.375, "tpot_s": 0.0234375,
    "e2e_s": 1.875, "iterations": 64, "avg_iter_s": 0.0234375, "preemptions": 2,
    "slo_ttft_target_s": 0.5, "slo_ok": False, "policy_actions": ["shed", "cap_max_tokens"], "tokenize_s": 0.004,
    "queue_depth": 6, "running_requests": 12, "kv_cache_usage": 0.75, "recent_step_s": 0.03125,
    "pending_requests": 7, "pending_prefill_tokens": 2**33,
    "pending_prefill_pairs": 2**40, "predicted_ttft_s": 0.25,
    "predicted_ttft_p90_s": 0.5, "predicted_tpot_s": 0.015625, "predicted_tpot_p90_s": 0.03125,
    "predicted_e2e_s": 2.25, "predictor_version": "hgb-0123abcd", "vip": True,
    "client": "alice", "estimated_ttft_s": 0.125, "length_class_low": 300,
    "length_class_high": 600, "admission_wait_s": 0.0625,
}


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "trace.duckdb")


def read_all(path: str, sql: str) -> list[tuple]:
    with duckdb.connect(path, read_only=True) as conn:
        return conn.execute(sql).fetchall()


def wait_until(condition, timeout_s: float) -> float:
    """Poll `condition`; return the seconds it took to hold (fails the test on timeout)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, "condition not met in time"
        time.sleep(0.01)
    return time.monotonic() - started


# --- schema --------------------------------------------------------------------------

def test_each_table_is_created_with_the_declared_columns_in_order(db_path):
    TraceLog(db_path).close()
    for spec in TABLES.values():
        described = read_all(db_path,
                             f"SELECT column_name, column_type FROM (DESCRIBE {spec.name})")
        assert described == [(n, DESCRIBED.get(t, t)) for n, t in spec.columns]
        assert spec.arrow_schema.names == list(spec.column_names)


def test_reopening_a_file_keeps_rows_and_creates_nothing_twice(db_path):
    with TraceLog(db_path) as log:
        log.add("requests", {"request_id": "a"})
    with TraceLog(db_path) as log:
        log.add("requests", {"request_id": "b"})
    with duckdb.connect(db_path) as conn:
        assert create_schema(conn) == []
    assert read_all(db_path, "SELECT request_id FROM requests ORDER BY 1") == [("a",), ("b",)]


def test_an_older_file_gains_the_missing_columns_and_rows_land_by_name(db_path):
    old_columns = [c for c in REQUESTS.columns if c[0] not in ("endpoint", "policy_actions")]
    with duckdb.connect(db_path) as conn:
        conn.execute(f"CREATE TABLE requests ({', '.join(f'{n} {t}' for n, t in old_columns)})")
        conn.execute("INSERT INTO requests (request_id) VALUES ('old')")
    with TraceLog(db_path) as log:
        log.add("requests", {"request_id": "new", "endpoint": "/v1/completions",
                             "policy_actions": ["shed"], "status": "ok"})
    names = [n for (n,) in read_all(db_path, "SELECT column_name FROM (DESCRIBE requests)")]
    assert names[-2:] == ["endpoint", "policy_actions"]  # added at the end
    rows = read_all(db_path, "SELECT request_id, endpoint, policy_actions, status "
                             "FROM requests ORDER BY request_id")
    assert rows == [("new", "/v1/completions", ["shed"], "ok"), ("old", None, None, None)]


# --- writing -------------------------------------------------------------------------

def test_rows_round_trip_with_exact_values_and_types(db_path):
    with TraceLog(db_path) as log:
        log.add("requests", FULL_REQUEST)
        log.add("requests", {"request_id": "req-2", "arrival_ts": ARRIVAL.timestamp()})
        log.add("spans", {"span_id": "s1", "name": "llm.request", "start_ts": ARRIVAL,
                          "end_ts": ARRIVAL.timestamp() + 1.5, "duration_s": 1.5,
                          "attributes": {"gen_ai.request.model": "tiny", "n": [1, 2]}})
        log.add("spans", {"span_id": "s2", "attributes": '{"already": "text"}'})
        log.add("engine_stats", {"ts": 1741064767, "running": 3, "preemptions": 2**40})
    requests = read_all(db_path, "SELECT * FROM requests ORDER BY request_id")
    assert requests[0] == tuple(FULL_REQUEST[name] for name in REQUESTS.column_names)
    assert requests[1] == ("req-2", None, ARRIVAL) + (None,) * (len(REQUESTS.columns) - 3)
    spans = read_all(db_path, "SELECT span_id, start_ts, end_ts, attributes, "
                              "attributes->>'$.n[1]', typeof(attributes) FROM spans ORDER BY 1")
    assert spans == [
        ("s1", ARRIVAL, datetime(2025, 3, 4, 5, 6, 9, 390123, tzinfo=UTC),
         '{"gen_ai.request.model": "tiny", "n": [1, 2]}', "2", "JSON"),
        ("s2", None, None, '{"already": "text"}', None, "JSON"),
    ]
    stats = read_all(db_path, "SELECT ts, running, waiting, preemptions FROM engine_stats")
    assert stats == [(datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC), 3, None, 2**40)]


def test_a_bad_value_nulls_one_cell_and_keeps_the_row(db_path):
    with TraceLog(db_path) as log:
        log.add("requests", {"request_id": "a", "prompt_tokens": "many", "e2e_s": 0.5})
        log.add("spans", {"span_id": "s", "attributes": "{not json"})
    assert read_all(db_path, "SELECT request_id, prompt_tokens, e2e_s FROM requests") == [
        ("a", None, 0.5)]
    assert read_all(db_path, "SELECT attributes->>'$' FROM spans") == [("{not json",)]


def test_unknown_table_or_column_is_a_value_error():
    with TraceLog() as log:
        with pytest.raises(ValueError, match="unknown trace-log table 'reqs'"):
            log.add("reqs", {})
        with pytest.raises(ValueError, match="unknown column\\(s\\) for requests: colour, size"):
            log.add("requests", {"request_id": "a", "size": 1, "colour": "red"})
        assert log.stats()["pending_rows"] == 0


def test_four_threads_adding_ten_thousand_rows_each_write_exactly_forty_thousand(db_path):
    with TraceLog(db_path, flush_interval_s=0.05, max_buffer_rows=3000) as log:
        def add_rows(thread: int) -> None:
            for i in range(10_000):
                log.add("requests", {"request_id": f"{thread}-{i}", "prompt_tokens": i})

        threads = [threading.Thread(target=add_rows, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert read_all(db_path, "SELECT count(*), count(DISTINCT request_id), sum(prompt_tokens) "
                             "FROM requests") == [(40_000, 40_000, 4 * 49_995_000)]


def test_the_background_thread_flushes_within_the_interval(monkeypatch):
    monkeypatch.delenv(FLUSH_INTERVAL_ENV, raising=False)
    with TraceLog() as log:
        assert log.config.flush_interval_s == 1.0
        assert log.config.load_interval_s == 60.0  # into DuckDB every sixty flushes
    with TraceLog(flush_interval_s=0.02) as log:
        log.add("requests", {"request_id": "a"})
        assert log.stats()["rows_written"]["requests"] == 0
        # Bounded wait, not a timing assertion: the machine is shared and noisy.
        wait_until(lambda: log.stats()["rows_written"]["requests"] == 1, timeout_s=10)


def test_a_full_buffer_wakes_the_flusher_before_the_interval():
    with TraceLog(flush_interval_s=3600, max_buffer_rows=100) as log:
        for i in range(100):
            log.add("spans", {"span_id": str(i)})
        wait_until(lambda: log.stats()["rows_written"]["spans"] == 100, timeout_s=5)
        assert log.stats()["flushes"] == 1


def test_flushes_spool_the_rows_and_loads_put_them_into_duckdb(db_path):
    """Each flush makes its rows durable in the spool; DuckDB gets them every load
    interval (an INSERT's fixed cost, once a second, was most of a light server's
    trace-log CPU), before any read, and at an explicit flush."""
    with TraceLog(flush_interval_s=0.05) as log:
        assert log.config.load_interval_s == pytest.approx(3.0)  # sixty flushes
    with TraceLog(db_path, flush_interval_s=0.02, load_interval_s=3600) as log:
        log.add("engine_stats", {"ts": 1.7e9, "running": 1})
        log.add("requests", {"request_id": "a"})
        wait_until(lambda: log.stats()["rows_spooled"] == counts(requests=1, engine_stats=1),
                   timeout_s=10)
        time.sleep(0.1)  # several more background flushes: none loads
        assert log.stats()["rows_written"] == counts()
        assert log.stats()["pending_rows"] == 2
        assert Path(db_path + ".spool").stat().st_size > 0
        assert log.query("SELECT request_id FROM requests").rows == [("a",)]  # loads
        assert log.stats()["rows_written"] == counts(requests=1, engine_stats=1)
        assert log.stats()["rows_spooled"] == counts()
        assert Path(db_path + ".spool").stat().st_size == 0
        log.add("forecasts", {"ts": 1.7e9, "value": 0.5})
        assert log.flush()
        assert log.stats()["rows_written"]["forecasts"] == 1
    assert not Path(db_path + ".spool").exists()  # an empty spool goes at close
    with TraceLog(flush_interval_s=0.02, load_interval_s=0.1) as log:
        log.add("forecasts", {"value": 0.5})
        wait_until(lambda: log.stats()["rows_written"]["forecasts"] == 1, timeout_s=10)
    with pytest.raises(ValueError, match="load_interval_s must be > 0"):
        TraceLogConfig(flush_interval_s=1.0, load_interval_s=0)


def test_rows_waiting_past_load_rows_are_loaded_before_the_interval(db_path):
    """A busy server's minute of rows is loaded once `LOAD_ROWS` wait: a bounded load
    and bounded memory, and never the flush that skips the spool (`max_buffer_rows`)."""
    with TraceLog(db_path, flush_interval_s=0.05, load_interval_s=3600) as log:
        for i in range(LOAD_ROWS - 1):
            log.add("spans", {"span_id": str(i)})
        wait_until(lambda: log.stats()["rows_spooled"]["spans"] == LOAD_ROWS - 1,
                   timeout_s=10)
        assert log.stats()["rows_written"]["spans"] == 0  # one row short: kept
        log.add("spans", {"span_id": "last"})
        wait_until(lambda: log.stats()["rows_written"]["spans"] == LOAD_ROWS, timeout_s=10)
        assert log.stats()["rows_spooled"] == counts()


def test_flush_interval_comes_from_argument_then_environment_then_default(monkeypatch):
    monkeypatch.setenv(FLUSH_INTERVAL_ENV, "0.25")
    assert TraceLogConfig().flush_interval_s == 0.25
    assert TraceLogConfig(flush_interval_s=2.0).flush_interval_s == 2.0
    monkeypatch.setenv(FLUSH_INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match=FLUSH_INTERVAL_ENV):
        TraceLogConfig()
    with pytest.raises(ValueError, match="max_pending_rows must be > 0"):
        TraceLogConfig(flush_interval_s=1.0, max_pending_rows=0)


@pytest.mark.parametrize(("argument", "env", "applied"), [
    (None, None, "488.2 MiB"),  # the default, 512MB (DuckDB shows MiB)
    (None, "64MB", "61.0 MiB"),
    ("1GiB", "64MB", "1.0 GiB"),  # the argument wins
])
def test_the_writer_memory_limit_comes_from_argument_then_environment_then_default(
        db_path, monkeypatch, argument, env, applied):
    assert DEFAULT_MEMORY_LIMIT == "512MB"
    if env is None:
        monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    else:
        monkeypatch.setenv(MEMORY_LIMIT_ENV, env)
    with TraceLog(db_path, memory_limit=argument) as log:
        assert log.query("SELECT current_setting('memory_limit')").rows == [(applied,)]


@pytest.mark.parametrize("bad", ["lots", "512", "-1GB", "1 PB", ""])
def test_a_bad_memory_limit_is_a_value_error(bad):
    with pytest.raises(ValueError, match="memory limit must look like 512MB"):
        TraceLogConfig(flush_interval_s=1.0, memory_limit=bad)


def test_a_query_bigger_than_the_memory_limit_spills_and_answers(db_path):
    # the cap bounds the cache, not what a query may do: a sort of ~300 MB spills
    # to the file's .tmp directory (allowed with external access off)
    with TraceLog(db_path, memory_limit="64MB") as log:
        result = log.query("SELECT count(*), min(x) >= 0 FROM (SELECT range, random() AS x "
                           "FROM range(20000000) ORDER BY x)", timeout_s=120)
        assert result.rows == [(20_000_000, True)]


def test_rows_beyond_the_pending_limit_are_dropped_and_counted():
    with TraceLog(flush_interval_s=3600, max_pending_rows=10) as log:
        for i in range(15):
            log.add("requests", {"request_id": str(i)})
        assert log.stats()["pending_rows"] == 10
        log.flush()
        assert log.stats() == {
            "rows_written": {**dict.fromkeys(TABLES, 0), "requests": 10},
            "rows_dropped": {**dict.fromkeys(TABLES, 0), "requests": 5},
            "flushes": 1, "last_flush_s": log.stats()["last_flush_s"], "pending_rows": 0,
            "loads": 1, "last_load_s": log.stats()["last_load_s"],
            "rows_spooled": dict.fromkeys(TABLES, 0),
            # In memory nothing is durable; no flush or spool write is running.
            "last_flush_age_s": None, "flush_running_s": 0.0, "spool_write_running_s": 0.0,
        }
        assert log.stats()["last_flush_s"] > 0 and log.stats()["last_load_s"] > 0


class FailingDisk:
    """The writer's connection with a switchable fault: while `error` is set, every
    statement fails with it before reaching DuckDB (as a full disk fails a commit)."""

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self.conn, self.error, self.tries = conn, None, 0

    def execute(self, *args):
        if self.error is not None:
            self.tries += 1
            raise self.error
        return self.conn.execute(*args)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def broken_log(path: str, **kw) -> tuple[TraceLog, FailingDisk]:
    log = TraceLog(path, flush_interval_s=3600, **kw)
    disk = log._store._conn = FailingDisk(log._store._conn)
    disk.error = duckdb.IOException('Could not write file "trace.duckdb": File too large')
    return log, disk


def counts(**tables: int) -> dict[str, int]:
    return {**dict.fromkeys(TABLES, 0), **tables}


def test_a_failed_batch_is_kept_retried_and_written_once_when_the_disk_recovers(
        db_path, caplog):
    log, disk = broken_log(db_path)
    with caplog.at_level(logging.WARNING, logger="observe.tracelog"):
        for i in range(3):
            log.add("requests", {"request_id": f"r{i}"})
            log.add("spans", {"span_id": f"s{i}"})
            assert log.flush() is False  # never raises
        assert disk.tries == 3  # one try a flush: the first failure stops it
        assert log.stats()["rows_dropped"] == counts()
        assert log.stats()["rows_written"] == counts()
        assert log.stats()["pending_rows"] == 6
        disk.error = None
        assert log.flush() is True
        log.close()
    assert log.stats()["rows_written"] == counts(requests=3, spans=3)
    assert log.stats()["rows_dropped"] == counts()
    assert log.stats()["pending_rows"] == 0
    assert read_all(db_path, "SELECT request_id FROM requests ORDER BY 1") == [
        ("r0",), ("r1",), ("r2",)]
    assert read_all(db_path, "SELECT span_id FROM spans ORDER BY 1") == [
        ("s0",), ("s1",), ("s2",)]
    assert [r.getMessage() for r in caplog.records] == [  # one line a streak, one a recovery
        f"trace log {db_path}: write failed, keeping rows in memory until it recovers: "
        f'IOException: Could not write file "trace.duckdb": File too large',
        f"trace log {db_path}: writes recovered"]


def test_kept_rows_count_against_the_pending_bound_and_the_newest_are_dropped(db_path):
    log, disk = broken_log(db_path, max_pending_rows=10)
    for i in range(6):
        log.add("requests", {"request_id": f"{i:02}"})
    assert log.flush() is False
    for i in range(6, 15):
        log.add("requests", {"request_id": f"{i:02}"})
    assert log.stats()["pending_rows"] == 10
    assert log.stats()["rows_dropped"] == counts(requests=5)  # 10..14, lost for good
    disk.error = None
    log.close()
    assert read_all(db_path, "SELECT request_id FROM requests ORDER BY 1") == [
        (f"{i:02}",) for i in range(10)]
    assert log.stats()["rows_written"] == counts(requests=10)


def test_rows_still_kept_at_close_are_counted_as_dropped(caplog):
    log = TraceLog(flush_interval_s=3600)  # in memory: no spool
    log._conn.close()  # the database goes away under the writer for good
    with caplog.at_level(logging.ERROR, logger="observe.tracelog"):
        for _ in range(3):
            log.add("requests", {"request_id": "lost"})
            log.add("spans", {"span_id": "lost"})
            log.flush()
        assert log.stats()["rows_dropped"] == counts()  # kept, not lost yet
        assert log.stats()["pending_rows"] == 6
        log.close()
        log.close()  # idempotent
    assert log.stats()["rows_dropped"] == counts(requests=3, spans=3)
    assert log.stats()["pending_rows"] == 0
    assert [r.getMessage() for r in caplog.records] == [
        "trace log :memory:: write failed, keeping rows in memory until it recovers: "
        "ConnectionException: Connection Error: Connection already closed!",
        "trace log :memory:: closed while writes fail; 6 rows lost, 0 left in the spool "
        "for the next open"]
    log.add("requests", {"request_id": "late"})  # after close: counted, not raised
    assert log.stats()["rows_dropped"]["requests"] == 4


def test_rows_spooled_when_duckdb_fails_at_close_are_loaded_by_the_next_open(db_path,
                                                                             caplog):
    log = TraceLog(db_path, flush_interval_s=3600)
    log._conn.close()
    for i in range(3):
        log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
        log.add("spans", {"span_id": f"s{i}", "trace_id": "t"})
        assert log.flush() is False
    with caplog.at_level(logging.ERROR, logger="observe.tracelog"):
        log.close()
    assert log.stats()["rows_dropped"] == counts()
    assert caplog.records[-1].getMessage() == (
        f"trace log {db_path}: closed while writes fail; 0 rows lost, 6 left in the spool "
        "for the next open")
    with TraceLog(db_path) as again:
        assert again.stats()["rows_written"] == counts(requests=3, spans=3)
        assert again.query("SELECT request_id FROM requests ORDER BY 1").rows == [
            ("r0",), ("r1",), ("r2",)]
    assert not Path(db_path + ".spool").exists()


def test_a_batch_duckdb_refuses_for_its_content_is_dropped_not_retried(db_path, caplog):
    log, disk = broken_log(db_path)
    disk.error = duckdb.ConversionException("Could not convert string 'x' to INT32")
    log.add("requests", {"request_id": "bad"})
    with caplog.at_level(logging.ERROR, logger="observe.tracelog"):
        assert log.flush() is True
    assert log.stats()["rows_dropped"] == counts(requests=1)
    assert "dropped 1 requests rows" in caplog.records[0].getMessage()
    disk.error = None
    log.add("requests", {"request_id": "good"})
    log.close()
    assert disk.tries == 1
    assert read_all(db_path, "SELECT request_id FROM requests") == [("good",)]


# A real disk fault: a child process whose file-size limit (RLIMIT_FSIZE, which binds
# root too) is lowered under the writer and raised again.
FSIZE_CHILD = r"""
import json, resource, signal, sys
from observe.tracelog import TraceLog
# CPython ignores SIGXFSZ from startup, so a write past the limit fails with EFBIG.
assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
path, limit = sys.argv[1], int(sys.argv[2])
log = TraceLog(path, flush_interval_s=3600)
def batch(tag):
    for i in range(20_000):
        log.add("requests", {"request_id": f"{tag}-{i}", "prompt_tokens": i})
        log.add("spans", {"span_id": f"{tag}-{i}", "attributes": {"i": i}})
batch("before")
assert log.flush()
size = max(resource.getrlimit(resource.RLIMIT_FSIZE)[0], 0)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
batch("during")
failed = [log.flush(), log.flush()]
during = log.stats()
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
recovered = log.flush()
log.close()
print(json.dumps({"failed": failed, "during": during, "recovered": recovered,
                  "after": log.stats()}))
"""


@pytest.mark.parametrize("limit", [0, "size"], ids=["nothing-writable", "disk-full"])
def test_a_real_file_size_limit_keeps_rows_and_the_retry_duplicates_nothing(
        db_path, limit, caplog):
    TraceLog(db_path).close()
    cap = 0 if limit == 0 else Path(db_path).stat().st_size + 300_000  # room for a part
    done = subprocess.run([sys.executable, "-c", FSIZE_CHILD, db_path, str(cap)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["failed"] == [False, False] and out["recovered"] is True
    assert out["during"]["rows_written"] == counts(requests=20_000, spans=20_000)
    assert out["during"]["pending_rows"] == 40_000
    assert out["after"]["rows_written"] == counts(requests=40_000, spans=40_000)
    assert out["after"]["rows_dropped"] == counts()
    assert "File too large" in done.stderr
    for sink in ("write", "spool write"):  # one line a failure streak, one a recovery
        assert done.stderr.count(f"{db_path}: {sink} failed") == 1, done.stderr[-2000:]
        assert done.stderr.count(f"{db_path}: {sink}s recovered") == 1
    assert read_all(db_path, "SELECT count(*), count(DISTINCT request_id), "
                             "sum(prompt_tokens) FROM requests") == [
        (40_000, 40_000, 2 * 199_990_000)]
    assert read_all(db_path, "SELECT count(*), count(DISTINCT span_id) FROM spans") == [
        (40_000, 40_000)]


# --- reading -------------------------------------------------------------------------

@pytest.fixture
def filled_log():
    with TraceLog(flush_interval_s=3600) as log:
        for i in range(3):
            log.add("requests", {"request_id": f"r{i}", "e2e_s": i / 4, "arrival_ts": ARRIVAL})
        log.flush()
        yield log


def test_query_returns_columns_rows_and_types(filled_log):
    result = filled_log.query("SELECT request_id, e2e_s FROM requests WHERE e2e_s > ? "
                              "ORDER BY 1", [0.1])
    assert result == QueryResult(["request_id", "e2e_s"], [("r1", 0.25), ("r2", 0.5)],
                                 truncated=False, types=["VARCHAR", "DOUBLE"])
    assert filled_log.query("DESCRIBE requests").rows[0][:2] == ("request_id", "VARCHAR")
    assert check_read_only("  SELECT 1 AS one ;").strip(" ;") == "SELECT 1 AS one"


def test_queries_compute_dates_in_utc_on_the_server_and_on_a_file(db_path):
    sql = "SELECT current_setting('TimeZone'), date_trunc('day', arrival_ts) FROM requests"
    expected = [("UTC", datetime(2025, 3, 4, tzinfo=UTC))]
    with TraceLog(db_path) as log:  # 02:00 UTC is still March 3rd west of Greenwich
        log.add("requests", {"arrival_ts": datetime(2025, 3, 4, 2, 0, tzinfo=UTC)})
        log.flush()
        assert log.query(sql).rows == expected
    assert query_file(db_path, sql).rows == expected


def test_query_truncates_to_max_rows_and_says_so(filled_log):
    assert filled_log.query("SELECT * FROM range(25)", max_rows=10).truncated is True
    assert len(filled_log.query("SELECT * FROM range(25)", max_rows=10).rows) == 10
    assert filled_log.query("SELECT * FROM range(10)", max_rows=10).truncated is False


@pytest.mark.parametrize("sql, reason", [
    ("INSERT INTO requests (request_id) VALUES ('x')", "not INSERT"),
    ("DELETE FROM requests", "not DELETE"),
    ("UPDATE requests SET status = 'ok'", "not UPDATE"),
    ("COPY requests TO '/tmp/out.csv'", "not COPY"),
    ("ATTACH '/tmp/other.duckdb' AS other", "not ATTACH"),
    ("CREATE TABLE t (a INTEGER)", "not CREATE"),
    ("DROP TABLE requests", "not DROP"),
    ("PRAGMA version", "not PRAGMA"),
    ("SET threads = 1", "not SET"),
    ("EXPLAIN ANALYZE DELETE FROM requests", "not EXPLAIN"),
    ("SELECT 1; SELECT 2", "expected exactly one statement, got 2"),
    ("SELECT 1; DELETE FROM requests", "expected exactly one statement, got 2"),
    ("WITH gone AS (DELETE FROM requests RETURNING *) SELECT * FROM gone",
     "data-modifying statements are not allowed \\(DELETE\\)"),
    ("SELEC 1", "cannot parse query"),
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv\\(\\) is not allowed"),
])
def test_query_refuses_anything_but_one_read_only_select(filled_log, sql, reason):
    with pytest.raises(QueryError, match=reason):
        filled_log.query(sql)
    assert filled_log.query("SELECT count(*) FROM requests").rows == [(3,)]


def test_a_slow_query_is_interrupted_and_the_writer_keeps_working(filled_log):
    started = time.monotonic()
    with pytest.raises(QueryError, match="^query timed out after 0.2s$"):
        filled_log.query("SELECT count(*) FROM range(1000000000) a, range(1000000000) b "
                         "WHERE a.range + b.range = -1", timeout_s=0.2)
    assert time.monotonic() - started < 5
    filled_log.add("requests", {"request_id": "after"})
    filled_log.flush()
    assert filled_log.query("SELECT count(*) FROM requests").rows == [(4,)]


def test_query_file_reads_a_file_no_server_holds(db_path):
    with TraceLog(db_path) as log:
        log.add("requests", {"request_id": "a", "arrival_ts": ARRIVAL})
    result = query_file(db_path, "SELECT request_id, arrival_ts FROM requests")
    assert result.rows == [("a", ARRIVAL)]
    with pytest.raises(QueryError, match="not DELETE"):
        query_file(db_path, "DELETE FROM requests")
    with pytest.raises(QueryError, match="read_csv\\(\\) is not allowed"):
        query_file(db_path, "SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(QueryError, match="no trace log at"):
        query_file(db_path + ".missing", "SELECT 1")


def test_query_file_on_a_file_a_server_holds_says_to_use_url(db_path):
    TraceLog(db_path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ready', flush=True); time.sleep(60)", db_path],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(QueryError, match="held by a running tailguard server.*--url"):
            query_file(db_path, "SELECT count(*) FROM requests")
    finally:
        holder.kill()
        holder.wait()


# --- formatting ----------------------------------------------------------------------

TINY = QueryResult(
    columns=["request_id", "arrival_ts", "e2e_s", "slo_ok", "actions", "attributes"],
    rows=[("r1", ARRIVAL, 1.25, True, ["shed"], '{"k": 1}'),
          ("r22", None, 10.5, None, [], None)],
    types=["VARCHAR", "TIMESTAMP WITH TIME ZONE", "DOUBLE", "BOOLEAN", "VARCHAR[]", "JSON"],
)


def test_format_result_renders_aligned_text_csv_and_json_with_iso_timestamps():
    assert format_result(TINY, "table") == (
        "request_id  arrival_ts                        e2e_s  slo_ok  actions   attributes\n"
        "----------  --------------------------------  -----  ------  --------  ----------\n"
        "r1          2025-03-04T05:06:07.890123+00:00   1.25  true    [\"shed\"]  {\"k\": 1}\n"
        "r22         NULL                               10.5  NULL    []        NULL\n"
        "(2 rows)\n"
    )
    assert format_result(TINY, "csv") == (
        "request_id,arrival_ts,e2e_s,slo_ok,actions,attributes\n"
        'r1,2025-03-04T05:06:07.890123+00:00,1.25,true,"[""shed""]","{""k"": 1}"\n'
        "r22,,10.5,,[],\n"
    )
    assert json.loads(format_result(TINY, "json")) == [
        {"request_id": "r1", "arrival_ts": "2025-03-04T05:06:07.890123+00:00", "e2e_s": 1.25,
         "slo_ok": True, "actions": ["shed"], "attributes": {"k": 1}},
        {"request_id": "r22", "arrival_ts": None, "e2e_s": 10.5, "slo_ok": None,
         "actions": [], "attributes": None},
    ]
    one = QueryResult(["ts", "attrs"], [(ARRIVAL, '{"k": 1}')], types=["TIMESTAMP", "JSON"])
    assert format_result(one, "json") == (
        '[\n  {\n    "ts": "2025-03-04T05:06:07.890123+00:00",\n'
        '    "attrs": {\n      "k": 1\n    }\n  }\n]\n'
    )
    with pytest.raises(ValueError, match="fmt must be one of table, csv, json"):
        format_result(TINY, "xml")
