"""The trace log's spool: a flush's rows are durable before DuckDB has them, a writer
that opens the file loads what a killed one left, and nothing is written twice."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from observe.query import query_file
from observe.schema import TABLES
from observe.tracelog import TraceLog
from observe.tracelog.spool import Spool, read_spool
from tests.test_tracelog import db_path, read_all, wait_until  # noqa: F401 (a fixture)

KILLED_CHILD = r"""
import os, signal, sys
from observe.tracelog import TraceLog
log = TraceLog(sys.argv[1], flush_interval_s=3600, load_interval_s=3600)
for i in range(50):
    log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
    log.add("spans", {"trace_id": f"t{i}", "span_id": "s", "name": "llm.request"})
assert log.flush()  # the first half goes into DuckDB
for i in range(50, 80):
    log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
log._spool()  # the second half only reaches the spool
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_rows_a_killed_writer_spooled_are_there_after_the_next_open(db_path):
    done = subprocess.run([sys.executable, "-c", KILLED_CHILD, db_path],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert read_all(db_path, "SELECT count(*) FROM requests") == [(50,)]  # DuckDB alone
    assert [(name, t.num_rows) for name, t in read_spool(db_path + ".spool")] == [
        ("requests", 30)]
    # The CLI's read of a file no server holds loads the spool first.
    assert query_file(db_path, "SELECT count(*), count(DISTINCT request_id) "
                               "FROM requests").rows == [(80, 80)]
    assert not Path(db_path + ".spool").exists()
    assert read_all(db_path, "SELECT count(*) FROM spans") == [(50,)]


def test_a_crash_between_the_insert_and_emptying_the_spool_writes_nothing_twice(
        db_path, monkeypatch):
    monkeypatch.setattr(Spool, "clear", lambda self: None)  # the crash's window, held open
    with TraceLog(db_path, flush_interval_s=3600) as log:
        for i in range(5):
            log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
        assert log.flush()
        log.add("requests", {"request_id": "late", "arrival_ts": 1.8e9})
        log._spool()  # spooled after the load: not in DuckDB
    # close() loaded "late" too; the spool still holds both frames, both loaded
    assert [t.num_rows for _, t in read_spool(db_path + ".spool")] == [5, 1]
    monkeypatch.undo()
    with TraceLog(db_path) as again:
        assert again.stats()["rows_written"]["requests"] == 0  # both found loaded
    assert read_all(db_path, "SELECT count(*), count(DISTINCT request_id) FROM requests") \
        == [(6, 6)]
    assert not Path(db_path + ".spool").exists()


def test_a_torn_last_frame_an_older_schema_and_an_unknown_table(db_path, caplog):
    TraceLog(db_path).close()
    spool = Spool(db_path + ".spool")
    old = pa.record_batch([pa.array(["old"]), pa.array([3], pa.int32())],
                          names=["request_id", "prompt_tokens"])  # before later columns
    spool.append([("requests", [old]), ("no_such_table", [old])])
    spool.close()
    with open(db_path + ".spool", "ab") as f:  # a frame the kill cut short
        f.write(b"\x08\x00\x00\x00\xff\xff\x00\x00\x00\x00\x00\x00requ")
    with caplog.at_level(logging.ERROR, logger="observe.tracelog"):
        TraceLog(db_path).close()
    assert "skipped a frame of unknown table 'no_such_table'" in caplog.text
    assert read_all(db_path, "SELECT request_id, prompt_tokens, client FROM requests") == [
        ("old", 3, None)]


def test_a_spool_append_that_fails_leaves_only_whole_frames(tmp_path):
    spool = Spool(str(tmp_path / "x.spool"))
    batch = pa.record_batch([pa.array(["a"])], names=["request_id"])
    spool.append([("requests", [batch])])
    size = spool.size
    os.close(spool._fd)
    spool._fd = os.open(os.devnull, os.O_RDONLY)  # every write fails now (EBADF)
    with pytest.raises(OSError):
        spool.append([("requests", [batch])])
    assert Path(spool.path).stat().st_size == size
    assert [(n, t.num_rows) for n, t in read_spool(spool.path)] == [("requests", 1)]


def test_every_table_has_a_key_of_its_own_columns():
    for spec in TABLES.values():
        assert spec.key and set(spec.key) <= set(spec.column_names), spec.name


def test_rows_past_the_buffer_bound_go_to_duckdb_without_the_spool(db_path, monkeypatch):
    """A writer behind (max_buffer_rows or more waiting) hands its rows to the load at
    once, and DuckDB's commit is their durability: no spool write; only rows it refuses
    for a passing fault are spooled, and kept."""
    from observe.tracelog import store

    appended: list[int] = []
    real_append = Spool.append
    monkeypatch.setattr(Spool, "append", lambda self, frames: appended.append(1)
                        or real_append(self, frames))
    with TraceLog(db_path, flush_interval_s=3600, load_interval_s=3600,
                  max_buffer_rows=100) as log:
        for i in range(150):  # the 100th row wakes the flusher, which wakes the load
            log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
        wait_until(lambda: log.stats()["rows_written"]["requests"] >= 100, timeout_s=10)
        with log._flush_lock:
            assert log._spool()
        wait_until(lambda: log.stats()["rows_written"]["requests"] == 150, timeout_s=10)
        assert appended == []

        def refuse(self, spec, batches):
            raise duckdb.OperationalError("IO Error: No space left on device")

        monkeypatch.setattr(store.FrameStore, "_insert", refuse)
        for i in range(99):
            log.add("requests", {"request_id": f"s{i}", "arrival_ts": 1.8e9 + i})
        log.add("requests", {"request_id": "s99", "arrival_ts": 1.8e9 + 99})
        wait_until(lambda: log.stats()["rows_spooled"]["requests"] == 100, timeout_s=10)
        assert appended == [1] and log.stats()["rows_written"]["requests"] == 150
        monkeypatch.undo()
    assert read_all(db_path, "SELECT count(*), count(DISTINCT request_id) FROM requests") \
        == [(250, 250)]


def test_a_stalled_load_does_not_stall_the_spool(db_path, monkeypatch):
    """The load runs beside the spooling: while an INSERT hangs (a DuckDB checkpoint on
    a slow disk took seconds on a CI machine, and a kill -9 then lost what the clients
    had seen complete 3 s before), each flush's rows still become durable in the
    spool. Frames spooled during the load stay in the spool after it, the loaded ones
    go, and a kill then loses nothing and writes nothing twice."""
    from observe.tracelog import store

    entered, release = threading.Event(), threading.Event()
    real_insert = store.FrameStore._insert

    def stalled(self, spec, batches):
        entered.set()
        assert release.wait(30)
        real_insert(self, spec, batches)

    monkeypatch.setattr(store.FrameStore, "_insert", stalled)
    log = TraceLog(db_path, flush_interval_s=0.02, load_interval_s=3600)
    log.add("requests", {"request_id": "r0", "arrival_ts": 1.7e9})
    wait_until(lambda: log.stats()["rows_spooled"]["requests"] == 1, timeout_s=10)
    loader = threading.Thread(target=log._load_spooled)  # a read's load, the same lock
    loader.start()
    assert entered.wait(10)
    for i in range(1, 4):
        log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
        wait_until(lambda: log.stats()["rows_spooled"]["requests"] == i + 1, timeout_s=10)
    release.set()
    loader.join(30)
    assert log.stats()["rows_written"]["requests"] == 1
    # The spool now holds only what was spooled during the load, as whole frames.
    assert sorted(t.column("request_id").to_pylist()[0]
                  for _, t in read_spool(db_path + ".spool")) == ["r1", "r2", "r3"]
    log.add("requests", {"request_id": "r4", "arrival_ts": 1.7e9 + 4})
    wait_until(lambda: log.stats()["rows_spooled"]["requests"] == 4, timeout_s=10)
    monkeypatch.undo()
    log._stop.set()  # as a kill -9 would leave it: no close, no final flush
    log._wake.set()
    log._load_wake.set()
    for thread in log._threads:
        thread.join()
    log._conn.close()
    log._store.spool.close()
    assert query_file(db_path, "SELECT count(*), count(DISTINCT request_id) "
                               "FROM requests").rows == [(5, 5)]
    assert not Path(db_path + ".spool").exists()


def test_a_spool_write_the_disk_holds_shows_in_the_stats(db_path, monkeypatch):
    """A slow disk holds the spool's fdatasync (a CI machine's ext4 image held it over
    3 s while a load wrote DuckDB beside it, and a kill -9 lost rows completed 3 s
    before): no row added since the last completed flush is durable, and the stats
    say so. `spool_write_running_s` counts the held write, `last_flush_age_s` grows
    past it; once the disk lets go, both come back."""
    from observe.tracelog import spool

    log = TraceLog(db_path, flush_interval_s=0.05, load_interval_s=3600)
    log.add("requests", {"request_id": "r0", "arrival_ts": 1.7e9})
    wait_until(lambda: log.stats()["rows_spooled"]["requests"] == 1, timeout_s=10)
    entered, release = threading.Event(), threading.Event()
    real_sync = os.fdatasync

    def held(fd: int) -> None:
        entered.set()
        assert release.wait(30)
        real_sync(fd)

    monkeypatch.setattr(spool.os, "fdatasync", held)
    log.add("requests", {"request_id": "r1", "arrival_ts": 1.7e9 + 1})
    # After the add: an empty flush may begin and end between a clock read before it
    # and the add, and r1 is not durable in any case while its flush is held.
    added = time.monotonic()
    assert entered.wait(10)
    time.sleep(0.3)
    stats = log.stats()
    assert stats["spool_write_running_s"] >= 0.3
    assert stats["flush_running_s"] >= stats["spool_write_running_s"]
    # r1 came after the last completed flush began: the age says it is not durable.
    assert stats["last_flush_age_s"] > time.monotonic() - added
    assert stats["rows_spooled"]["requests"] == 1
    release.set()
    wait_until(lambda: log.stats()["rows_spooled"]["requests"] == 2, timeout_s=10)
    wait_until(lambda: log.stats()["spool_write_running_s"] == 0.0
               and log.stats()["last_flush_age_s"] < 0.3, timeout_s=10)
    monkeypatch.undo()
    log.close()
    assert query_file(db_path, "SELECT count(*) FROM requests").rows == [(2,)]
