"""The trace-log archive: rows older than a cutoff move from DuckDB files into
hive-partitioned Parquet (table/date=/instance=), which `tailguard query --archive`
and pyarrow read as one fleet-wide dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from observe.archive import (
    TIME_COLUMNS,
    ArchiveConfig,
    ArchiveError,
    Rotator,
    archive_file,
    archive_rows,
    instance_name,
    query_archive,
)
from observe.query import QueryError, query_file
from observe.schema import TABLES
from observe.tracelog import TraceLog

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
CUTOFF = datetime(2026, 3, 4, tzinfo=timezone.utc)
# Two servers of a fleet: (name, first request, hours between requests, requests).
FLEET = {"gpu1_8000": (T0 + timedelta(hours=1), 2, 48),  # 12 a day, 03-01 .. 03-04
         "gpu2_8000": (T0 + timedelta(days=1), 3, 24)}  # 8 a day, 03-02 .. 03-04


def tailguard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailguard", *args], capture_output=True,
                          text=True, timeout=60)


def write_log(path: Path, name: str, first: datetime, step_h: int, count: int) -> None:
    with TraceLog(path) as log:
        for i in range(count):
            ts = first + timedelta(hours=step_h * i)
            rid = f"{name}-r{i}"
            log.add("requests", {"request_id": rid, "arrival_ts": ts, "status": "ok",
                                 "policy_actions": ["shed"] if i % 2 else []})
            for part in ("llm.queue", "llm.decode"):
                log.add("spans", {"request_id": rid, "name": part, "start_ts": ts,
                                  "attributes": {"i": i}})
            log.add("engine_stats", {"ts": ts, "running": i})


def archive(db: Path, out: Path, name: str, before: datetime = CUTOFF) -> dict[str, int]:
    with TraceLog(db) as log:
        return log.with_writer(lambda conn: archive_rows(conn, out, name, before))


def partition_rows(out: Path, table: str) -> dict[str, int]:
    """Rows per `date=.../instance=...` directory, read straight from the files."""
    rows: Counter = Counter()
    for path in (out / table).glob("*/*/*.parquet"):
        rows[f"{path.parent.parent.name}/{path.parent.name}"] += pq.read_metadata(path).num_rows
    return dict(rows)


def make_fleet(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """Two servers' trace files archived into one directory, as a fleet does."""
    out = tmp_path / "archive"
    dbs = {}
    for name, (first, step_h, count) in FLEET.items():
        dbs[name] = tmp_path / f"{name}.duckdb"
        write_log(dbs[name], name, first, step_h, count)
        assert archive(dbs[name], out, name) == {
            "requests": 36 if name == "gpu1_8000" else 16,
            "spans": 72 if name == "gpu1_8000" else 32,
            "engine_stats": 36 if name == "gpu1_8000" else 16,
            "policy_events": 0, "overrides": 0, "forecasts": 0}
    return out, dbs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    return make_fleet(tmp_path_factory.mktemp("fleet"))  # tests using it only read


def test_every_trace_log_table_has_a_timestamp_time_column():
    assert TIME_COLUMNS.keys() == TABLES.keys()
    for table, column in TIME_COLUMNS.items():
        assert dict(TABLES[table].columns)[column] == "TIMESTAMPTZ"


def test_rotation_writes_one_partition_per_utc_date_and_instance_with_exact_counts(fleet):
    out, _ = fleet
    expected = {"date=2026-03-01/instance=gpu1_8000": 12,
                "date=2026-03-02/instance=gpu1_8000": 12,
                "date=2026-03-03/instance=gpu1_8000": 12,
                "date=2026-03-02/instance=gpu2_8000": 8,
                "date=2026-03-03/instance=gpu2_8000": 8}
    assert partition_rows(out, "requests") == expected
    assert partition_rows(out, "spans") == {k: 2 * v for k, v in expected.items()}
    assert sorted(p.name for p in out.iterdir()) == ["engine_stats", "requests", "spans"]
    assert not list(out.rglob("_inflight-*"))


def test_rotated_rows_leave_the_database_and_the_recent_ones_stay(fleet):
    _, dbs = fleet
    sql = ("SELECT count(*), min(arrival_ts), (SELECT count(*) FROM spans), "
           "(SELECT count(*) FROM archive_rotations) FROM requests")
    assert query_file(dbs["gpu1_8000"], sql).rows == [(12, CUTOFF + timedelta(hours=1), 24, 1)]
    assert query_file(dbs["gpu2_8000"], sql).rows == [(8, CUTOFF, 16, 1)]


def test_a_second_rotation_appends_new_files_and_duplicates_nothing(tmp_path):
    out, dbs = make_fleet(tmp_path)
    first = {p: p.read_bytes() for p in out.rglob("*.parquet")}
    with TraceLog(dbs["gpu1_8000"]) as log:  # a late row for a day already archived
        log.add("requests", {"request_id": "late", "arrival_ts": T0 + timedelta(hours=5)})
    counts = archive(dbs["gpu1_8000"], out, "gpu1_8000", CUTOFF + timedelta(days=1))
    assert counts["requests"] == 13
    assert all(p.read_bytes() == data for p, data in first.items())  # nothing overwritten
    rows = partition_rows(out, "requests")
    assert rows["date=2026-03-01/instance=gpu1_8000"] == 13
    assert rows["date=2026-03-04/instance=gpu1_8000"] == 12
    day_one = out / "requests" / "date=2026-03-01" / "instance=gpu1_8000"
    assert len(list(day_one.glob("part-*.parquet"))) == 2
    result = query_archive(out, "SELECT count(*), count(DISTINCT request_id) FROM requests")
    assert result.rows == [(48 + 1 + 16, 48 + 1 + 16)]
    assert query_file(dbs["gpu1_8000"], "SELECT count(*) FROM requests").rows == [(0,)]


def test_each_policys_latest_override_stays_for_a_restarting_server(tmp_path):
    db = tmp_path / "t.duckdb"
    with TraceLog(db) as log:
        for hour, policy in [(1, "shed"), (2, "shed"), (3, "shed"), (1, "degrade")]:
            log.add("overrides", {"policy": policy, "mode": "force_on",
                                  "created_ts": T0 + timedelta(hours=hour)})
    assert archive(db, tmp_path / "a", "one")["overrides"] == 2
    latest = "SELECT policy, hour(created_ts) FROM overrides ORDER BY 1"
    assert query_file(db, latest).rows == [("degrade", 1), ("shed", 3)]
    assert query_archive(tmp_path / "a", latest).rows == [("shed", 1), ("shed", 2)]


def test_query_archive_on_the_command_line_returns_the_union_across_instances(fleet):
    out, _ = fleet
    result = tailguard("query", "--archive", str(out), "--format", "json",
                       "SELECT instance, date, count(*) AS n, count(DISTINCT request_id) AS ids, "
                       "sum(len(policy_actions)) AS shed FROM requests GROUP BY ALL ORDER BY ALL")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        {"instance": "gpu1_8000", "date": "2026-03-01", "n": 12, "ids": 12, "shed": 6},
        {"instance": "gpu1_8000", "date": "2026-03-02", "n": 12, "ids": 12, "shed": 6},
        {"instance": "gpu1_8000", "date": "2026-03-03", "n": 12, "ids": 12, "shed": 6},
        {"instance": "gpu2_8000", "date": "2026-03-02", "n": 8, "ids": 8, "shed": 4},
        {"instance": "gpu2_8000", "date": "2026-03-03", "n": 8, "ids": 8, "shed": 4}]


def test_archived_columns_keep_the_live_logs_names_order_and_types(fleet):
    out, _ = fleet
    result = query_archive(out, "SELECT * FROM spans WHERE request_id = 'gpu2_8000-r3' "
                                "AND name = 'llm.decode'")
    assert result.columns == [*TABLES["spans"].column_names, "date", "instance"]
    assert dict(zip(result.columns, result.types))["attributes"] == "JSON"
    row = dict(zip(result.columns, result.rows[0]))
    assert row["start_ts"] == T0 + timedelta(days=1, hours=9)
    assert json.loads(row["attributes"]) == {"i": 3}


def test_pyarrow_reads_the_same_hive_partitions_with_identical_counts(fleet):
    out, _ = fleet
    for table in ("requests", "spans", "engine_stats"):
        dataset = ds.dataset(out / table, format="parquet", partitioning="hive")
        counted = Counter((str(d), i) for d, i in zip(
            *dataset.to_table(columns=["date", "instance"]).to_pydict().values()))
        sql = f"SELECT CAST(date AS VARCHAR), instance, count(*) FROM {table} GROUP BY ALL"
        assert counted == {(d, i): n for d, i, n in query_archive(out, sql).rows}


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('{out}/../secret.txt')",
    "SELECT * FROM glob('/etc/*')",
    "COPY requests TO '{out}/stolen.csv'",
    "ATTACH '{out}/x.duckdb' AS x",
    "DELETE FROM requests",
    "SET enable_external_access = true",
    "WITH gone AS (DELETE FROM requests RETURNING *) SELECT count(*) FROM gone",
])
def test_the_archive_refuses_writes_and_reads_outside_it(fleet, sql):
    out, _ = fleet
    (out.parent / "secret.txt").write_text("secret")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(QueryError):
        query_archive(out, sql.format(out=out))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_refused_archive_query_on_the_command_line_exits_2_with_one_line(fleet):
    out, _ = fleet
    result = tailguard("query", "--archive", str(out), "SELECT * FROM read_csv('/etc/passwd')")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "read_csv() is not allowed" in result.stderr


def test_an_empty_archive_has_every_table_with_no_rows_and_a_missing_one_is_an_error(tmp_path):
    result = query_archive(tmp_path, "SELECT * FROM requests")
    assert result.rows == [] and result.columns[-2:] == ["date", "instance"]
    assert query_archive(tmp_path, "SELECT count(*) FROM forecasts").rows == [(0,)]
    with pytest.raises(QueryError, match="no archive directory"):
        query_archive(tmp_path / "missing", "SELECT 1")
    missing = tailguard("query", "--archive", str(tmp_path / "missing"), "SELECT 1")
    assert missing.returncode == 2 and "no such archive directory" in missing.stderr


def test_query_takes_exactly_one_source(tmp_path):
    both = tailguard("query", "--db", str(tmp_path / "t.duckdb"), "--archive", str(tmp_path),
                     "SELECT 1")
    assert both.returncode == 2
    assert "exactly one of --db FILE, --url URL or --archive DIR" in both.stderr


def test_a_failed_rotation_removes_its_files_and_keeps_every_row(tmp_path, monkeypatch):
    db, out = tmp_path / "t.duckdb", tmp_path / "a"
    write_log(db, "one", T0, 6, 8)

    def fail(conn, *args):
        raise OSError("disk full")

    monkeypatch.setattr("observe.archive._fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        archive(db, out, "one")
    assert not list(out.rglob("*.parquet")) and not list(out.rglob("_inflight-*"))
    assert query_file(db, "SELECT count(*) FROM requests").rows == [(8,)]


KILL = """
import os, sys
from datetime import datetime, timezone
import observe.archive as a
from observe.tracelog import TraceLog
setattr(a, sys.argv[3], lambda *args: os._exit(9))  # the process dies right there
log = TraceLog(sys.argv[1])
log.with_writer(lambda conn: a.archive_rows(conn, sys.argv[2], "one",
                                            datetime(2026, 3, 4, tzinfo=timezone.utc)))
"""


@pytest.mark.parametrize("dies_in,committed", [("_fsync", False), ("_publish", True)])
def test_a_rotation_killed_before_or_after_its_commit_is_finished_exactly_once(
        tmp_path, dies_in, committed):
    db, out = tmp_path / "t.duckdb", tmp_path / "a"
    write_log(db, "one", T0, 6, 20)  # 4 a day, 03-01 .. 03-05
    killed = subprocess.run([sys.executable, "-c", KILL, str(db), str(out), dies_in],
                            capture_output=True, text=True, timeout=60)
    assert killed.returncode == 9, killed.stderr
    assert len(list(out.rglob("_inflight-*.tmp"))) == 3 * 3  # 3 tables x 3 days, hidden
    assert query_archive(out, "SELECT count(*) FROM requests").rows == [(0,)]
    left = query_file(db, "SELECT count(*) FROM requests").rows[0][0]
    assert left == (8 if committed else 20)
    assert archive(db, out, "one")["requests"] == (0 if committed else 12)
    assert not list(out.rglob("_inflight-*"))
    assert partition_rows(out, "requests") == {
        f"date=2026-03-0{d}/instance=one": 4 for d in (1, 2, 3)}


def test_the_rotator_moves_what_is_older_than_its_retention_by_its_clock(tmp_path):
    db, out = tmp_path / "t.duckdb", tmp_path / "a"
    write_log(db, "one", T0, 6, 20)
    config = ArchiveConfig(out, "one", retention_s=2 * 86400, interval_s=60)
    rotator = Rotator(config, clock=lambda: (T0 + timedelta(days=5)).timestamp())
    with TraceLog(db) as log:
        log.add("requests", {"request_id": "buffered", "arrival_ts": T0})
        assert rotator.rotate(log)["requests"] == 12 + 1  # flushed, then moved
        assert rotator.rotate(log)["requests"] == 0
    assert rotator.stats.rotations == 2 and rotator.stats.rows["requests"] == 13


def test_instance_names_are_made_safe_and_unsafe_ones_refused(tmp_path):
    assert instance_name("gpu-1.example.com:8000") == "gpu-1.example.com_8000"
    assert instance_name("[::1]:8000") == "1_8000"
    with pytest.raises(ValueError, match="no usable characters"):
        instance_name("::")
    with pytest.raises(ValueError, match="use 'a_b'"):
        ArchiveConfig(tmp_path, "a/b")
    with pytest.raises(ValueError, match="interval_s"):
        ArchiveConfig(tmp_path, "a", interval_s=0)


def test_archive_command_moves_a_files_old_rows(tmp_path):
    db, out = tmp_path / "trace.duckdb", tmp_path / "a"
    now = datetime.now(timezone.utc)
    with TraceLog(db) as log:
        for age_h in (50, 49, 30, 1):
            log.add("requests", {"request_id": f"r{age_h}",
                                 "arrival_ts": now - timedelta(hours=age_h)})
    result = tailguard("archive", "--db", str(db), "--out", str(out), "--instance", "lab:1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"archived 3 rows as instance lab_1 to {out} (requests 3,")
    assert query_file(db, "SELECT request_id FROM requests").rows == [("r1",)]
    assert query_archive(out, "SELECT count(*) FROM requests WHERE instance = 'lab_1'").rows \
        == [(3,)]


def test_archive_file_names_the_instance_after_the_host_and_file(tmp_path):
    db = tmp_path / "trace.duckdb"
    write_log(db, "one", T0, 6, 4)
    name, counts = archive_file(db, tmp_path / "a", None, CUTOFF)
    assert name.endswith("_trace") and name == instance_name(name)
    assert counts["requests"] == 4


@pytest.mark.parametrize("args,needle", [
    (["--db", "{tmp}/none.duckdb", "--out", "{tmp}/a"], "no trace log at"),
    (["--db", "{tmp}/t.duckdb", "--out", "{tmp}/a", "--older-than", "3x"], "not a duration"),
    (["--db", "{tmp}/t.duckdb", "--out", "{tmp}/t.duckdb/sub"], "cannot archive"),
])
def test_archive_command_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    write_log(tmp_path / "t.duckdb", "one", T0, 6, 4)
    result = tailguard("archive", *[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr


def test_archiving_a_file_a_server_holds_says_the_server_archives_it(tmp_path):
    db = tmp_path / "t.duckdb"
    write_log(db, "one", T0, 6, 4)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(60)", str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ArchiveError, match="held by a running tailguard server"):
            archive_file(db, tmp_path / "a", "one", CUTOFF)
    finally:
        holder.kill()
        holder.wait()
    assert not os.path.exists(tmp_path / "a")
