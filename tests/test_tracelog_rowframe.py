"""Row frames: a small flush spooled as JSON keeps every value as the Arrow conversion
stores it, a hostile or torn frame stops the read there, and the load converts all of a
table's waiting row frames once."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import duckdb
import pyarrow as pa
import pytest

from observe import schema
from observe.schema import TABLES, arrow_table
from observe.tracelog import TraceLog, store
from observe.tracelog.rowframe import decode_rows, encode_rows
from observe.tracelog.spool import Spool, read_spool
from tests.test_tracelog import db_path, read_all  # noqa: F401 (a fixture)

UTC = timezone.utc


def awkward_values(spec, rows: int) -> dict[str, list]:
    """Columns of values at the edges of each type, NULLs among them."""
    columns = {}
    for name, sql_type in spec.columns:
        if sql_type == "TIMESTAMPTZ":
            pool = [datetime(2026, 12, 7, 5, 1, 2, 345678, tzinfo=UTC),
                    datetime(2026, 12, 7, 5, 1, 2, 345679),  # naive: read as UTC
                    datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=-5))),
                    1.8e9 + 0.000001, None]
        elif sql_type == "DOUBLE":
            pool = [0.1, -0.0, math.nan, math.inf, 1e-300, None]
        elif sql_type in ("INTEGER", "BIGINT"):
            pool = [0, -1, 2**31 - 1 if sql_type == "INTEGER" else 2**62, None]
        elif sql_type == "BOOLEAN":
            pool = [True, False, None]
        elif sql_type == "VARCHAR[]":
            pool = [["admit", "refuse:deadline"], [], None, ["é\u2028\"\\"]]
        elif sql_type == "JSON":
            pool = [{"a": [1, 2.5, None], "t": datetime(2026, 1, 1, tzinfo=UTC)}, "[1]",
                    None, {"ü": "\x00"}]
        else:
            pool = ["", "ünïcödé ✓", "quote \" and \\ and \n", "\x00nul", None]
        columns[name] = [pool[i % len(pool)] for i in range(rows)]
    return columns


@pytest.mark.parametrize("table", sorted(TABLES))
def test_a_row_frame_holds_what_the_arrow_conversion_stores(table):
    spec = TABLES[table]
    columns = awkward_values(spec, 12)
    decoded = decode_rows(spec, encode_rows(spec, columns))
    converted = arrow_table(spec, columns, 12)
    assert decoded.schema == converted.schema
    for name in spec.column_names:  # repr: NaN equals NaN, -0.0 is not 0.0
        assert list(map(repr, decoded.column(name).to_pylist())) == \
            list(map(repr, converted.column(name).to_pylist())), (table, name)


def test_every_microsecond_of_a_timestamp_survives_the_row_frame():
    spec = TABLES["requests"]
    start = datetime(1970, 1, 1, tzinfo=UTC)
    # spread over 1970-2100, odd microseconds: the float's last digits matter there
    stamps = [start + timedelta(microseconds=i * 40_998_012_345_677 + 1) for i in range(100)]
    columns = {name: [None] * 100 for name in spec.column_names}
    columns["arrival_ts"] = stamps
    decoded = decode_rows(spec, encode_rows(spec, columns))
    assert decoded.column("arrival_ts").to_pylist() == stamps


def test_a_value_json_cannot_hold_goes_as_arrow_and_only_its_cell_is_null(db_path, caplog):
    with TraceLog(db_path, flush_interval_s=3600, load_interval_s=3600) as log:
        log.add("requests", {"request_id": "odd", "arrival_ts": 1.7e9, "model": object()})
        log.add("requests", {"request_id": "even", "arrival_ts": 1.7e9 + 1, "model": "m"})
        log.add("spans", {"trace_id": "t", "span_id": "s", "name": "llm.request"})
        with caplog.at_level(logging.WARNING, logger="observe.schema"):
            assert log._spool()
        # the requests frame went as Arrow, the spans frame as JSON, both durable
        assert [(n, t.num_rows) for n, t in read_spool(db_path + ".spool")] == [
            ("requests", 2), ("spans", 1)]
    assert "stored NULL for 1 value(s)" in caplog.text
    assert read_all(db_path, "SELECT request_id, model FROM requests ORDER BY 1") == [
        ("even", "m"), ("odd", None)]


@pytest.mark.parametrize("payload", [
    b"{not json", b"[1, 2]", b'{"request_id": "r"}', b'{"request_id": ["a", "b"], '
    b'"prompt_tokens": [1]}', b'{"request_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"],
    ids=["torn", "not-an-object", "not-lists", "ragged", "nested-past-the-limit"])
def test_a_row_frame_that_is_not_one_ends_the_read_there(db_path, payload):
    TraceLog(db_path).close()
    spool = Spool(db_path + ".spool")
    before = encode_rows(TABLES["requests"], {name: [None] for name in
                                              TABLES["requests"].column_names})
    before = before.replace(b'"request_id":[null]', b'"request_id":["kept"]')
    spool.append([("requests", before), ("requests", payload), ("requests", before)])
    spool.close()
    assert [(n, t.num_rows) for n, t in read_spool(db_path + ".spool")] == [("requests", 1)]
    TraceLog(db_path).close()
    assert read_all(db_path, "SELECT request_id FROM requests") == [("kept",)]


def test_an_older_row_frame_and_an_unknown_table_beside_arrow_frames(db_path, caplog):
    TraceLog(db_path).close()
    spool = Spool(db_path + ".spool")
    arrow = pa.record_batch([pa.array(["arrow"])], names=["request_id"])
    spool.append([("requests", [arrow]),
                  ("requests", b'{"request_id":["json"],"prompt_tokens":[7],"gone":[1]}'),
                  ("no_such_table", b'{"x":[1,2]}')])
    spool.close()
    with caplog.at_level(logging.ERROR, logger="observe.tracelog"):
        TraceLog(db_path).close()
    assert "skipped a frame of unknown table 'no_such_table'" in caplog.text
    assert read_all(db_path, "SELECT request_id, prompt_tokens, client FROM requests "
                             "ORDER BY 1") == [("arrow", None, None), ("json", 7, None)]


KILLED_CHILD = r"""
import os, signal, sys
from observe.tracelog import TraceLog, store
store.ROW_FRAME_MAX_ROWS = 20  # a flush of more goes as Arrow
log = TraceLog(sys.argv[1], flush_interval_s=3600, load_interval_s=3600)
for flush in range(4):  # row frames and an Arrow frame, interleaved
    for i in range(5 if flush % 2 else 30):
        log.add("requests", {"request_id": f"r{flush}-{i}", "arrival_ts": 1.7e9 + i,
                             "policy_actions": ["admit"]})
    log._spool()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_row_and_arrow_frames_a_killed_writer_left_load_once(db_path):
    done = subprocess.run([sys.executable, "-c", KILLED_CHILD, db_path], capture_output=True,
                          text=True, timeout=120, cwd=os.getcwd())
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert [t.num_rows for _, t in read_spool(db_path + ".spool")] == [30, 5, 30, 5]
    TraceLog(db_path).close()
    assert read_all(db_path, "SELECT count(*), count(DISTINCT request_id), "
                             "count(*) FILTER (policy_actions = ['admit']) FROM requests") \
        == [(70, 70, 70)]


def test_the_load_converts_a_minute_of_row_frames_once_a_column(db_path, monkeypatch):
    """The regression guard of this design: sixty one-row flushes cost one Arrow
    conversion per column at the load, not sixty."""
    converted: list[int] = []
    real = schema._column_array
    with TraceLog(db_path, flush_interval_s=3600, load_interval_s=3600) as log:
        monkeypatch.setattr(schema, "_column_array",  # after the open's warm-up
                            lambda values, *a: converted.append(len(values)) or real(values, *a))
        for i in range(60):
            log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
            assert log._spool()
        assert converted == []  # spooled as JSON: no conversion yet
        assert log.flush()
        assert converted == [60] * len(TABLES["requests"].columns)
    assert read_all(db_path, "SELECT count(*) FROM requests") == [(60,)]


def test_rows_a_failing_load_keeps_wait_as_arrow(db_path, monkeypatch):
    """A long outage keeps its rows in the compact form, not as Python lists."""
    def refuse(self, spec, batches):
        raise duckdb.OperationalError("IO Error: No space left on device")

    with TraceLog(db_path, flush_interval_s=3600, load_interval_s=3600) as log:
        monkeypatch.setattr(store.FrameStore, "_insert", refuse)
        for i in range(3):
            log.add("requests", {"request_id": f"r{i}", "arrival_ts": 1.7e9 + i})
            log._spool()
        assert not log.flush()
        frames = log._store.frames
        assert [(f.rows, f.columns, sum(b.num_rows for b in f.batches)) for f in frames] \
            == [(1, None, 1)] * 3
        monkeypatch.undo()
    assert read_all(db_path, "SELECT list(request_id ORDER BY request_id) FROM requests") \
        == [(["r0", "r1", "r2"],)]
