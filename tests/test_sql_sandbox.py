"""The SQL sandbox, proven statement by statement on both ways in: the server's
`POST /admin/query` and `tailguard query --db FILE`.

Each case is refused (a 400 / exit code 2 whose one-line message names why) or is
allowed and shown harmless: the same answer on both, the database unchanged, no file
read (a sentinel file's secret never shows up) and no file written.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import httpx
import pytest
from click.testing import CliRunner

from observe.sql_gate import DENIED_FUNCTIONS, DENIED_PREFIXES, TABLE_FUNCTIONS
from observe.tracelog import TraceLog
from tests.conftest import ADMIN_TOKEN

SECRET = "tailguard-sentinel-7f3a9c"


@dataclass(frozen=True)
class Case:
    sql: str  # {sentinel}, {db} and {out} are filled in per target
    refused: str | None  # a word the refusal's message holds; None: allowed
    rows: list | None = None  # allowed: the exact rows, when they are known


CASES = {
    # state changes hidden in table functions, in every spelling
    "checkpoint()": Case("SELECT * FROM checkpoint()", "checkpoint"),
    "force_checkpoint()": Case("SELECT * FROM force_checkpoint()", "force_checkpoint"),
    "mixed case CheckPoint()": Case("SELECT * FROM CheckPoint()", "checkpoint"),
    "quoted \"checkpoint\"()": Case('SELECT * FROM "checkpoint"()', "checkpoint"),
    "schema-qualified checkpoint": Case("SELECT * FROM system.main.checkpoint()", "checkpoint"),
    "checkpoint in a subquery": Case("SELECT (SELECT count(*) FROM checkpoint())", "checkpoint"),
    "checkpoint in a CTE": Case("WITH c AS (SELECT * FROM checkpoint()) SELECT * FROM c",
                                "checkpoint"),
    "checkpoint after UNION ALL": Case("SELECT 1 UNION ALL SELECT 1 FROM force_checkpoint()",
                                       "force_checkpoint"),
    "checkpoint in a lateral join": Case(
        "SELECT * FROM range(1) r, LATERAL (SELECT * FROM checkpoint()) c", "checkpoint"),
    "checkpoint via EXISTS": Case(
        "SELECT count(*) FROM requests WHERE EXISTS (SELECT 1 FROM checkpoint())", "checkpoint"),
    "checkpoint in a table function's argument": Case(
        "SELECT * FROM range((SELECT count(*) FROM checkpoint()))", "checkpoint"),
    "enable_logging()": Case("SELECT * FROM enable_logging()", "enable_logging"),
    "query()": Case("SELECT * FROM query('DELETE FROM requests RETURNING 1')", "query"),
    "query_table()": Case("SELECT * FROM query_table('requests')", "query_table"),
    "json_execute_serialized_sql()": Case(
        "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "json_execute_serialized_sql"),
    "json_serialize_plan binds SQL": Case(
        "SELECT json_serialize_plan('SELECT * FROM checkpoint()')", "json_serialize_plan"),
    "duckdb_settings()": Case("SELECT * FROM duckdb_settings()", "duckdb_settings"),
    "test_all_types(), not listed": Case("SELECT * FROM test_all_types()", "test_all_types"),
    # reading files
    "read_csv /etc/passwd": Case("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
    "read_csv_auto of a list": Case("SELECT * FROM read_csv_auto(['/etc/*'])", "read_csv_auto"),
    "read_text sentinel": Case("SELECT * FROM read_text('{sentinel}')", "read_text"),
    "read_blob the db itself": Case("SELECT * FROM read_blob('{db}')", "read_blob"),
    "read_parquet": Case("SELECT * FROM read_parquet('{sentinel}')", "read_parquet"),
    "read_json_auto": Case("SELECT * FROM read_json_auto('/etc/passwd')", "read_json_auto"),
    "glob /etc": Case("SELECT * FROM glob('/etc/*')", "glob"),
    "sniff_csv": Case("SELECT * FROM sniff_csv('/etc/passwd')", "sniff_csv"),
    "parquet_metadata": Case("SELECT * FROM parquet_metadata('{sentinel}')", "parquet_metadata"),
    "file by name (replacement scan)": Case("SELECT * FROM '/etc/passwd'", "file"),
    "sentinel by name": Case("SELECT * FROM '{sentinel}'", "file"),
    "DESCRIBE a file": Case("DESCRIBE '{sentinel}'", "file"),
    "SHOW a file": Case("SHOW '{sentinel}'", "file"),
    "read_text in a lambda-free IN": Case(
        "SELECT count(*) FROM requests WHERE request_id IN "
        "(SELECT content FROM read_text('{sentinel}'))", "read_text"),
    # the environment, settings and other scalar side doors
    "getenv": Case("SELECT getenv('HOME')", "getenv"),
    "getenv inside a lambda": Case("SELECT list_transform([1], x -> getenv('HOME'))", "getenv"),
    "current_setting TimeZone": Case("SELECT current_setting('TimeZone')", None, [["UTC"]]),
    "current_setting of a secret": Case("SELECT current_setting('s3_secret_access_key')",
                                        "current_setting"),
    "current_setting of a column": Case("SELECT current_setting(status) FROM requests",
                                        "current_setting"),
    "nextval": Case("SELECT nextval('s')", "nextval"),
    "setseed": Case("SELECT setseed(0.5)", "setseed"),
    "write_log": Case("SELECT write_log('x')", "write_log"),
    "sleep_ms": Case("SELECT sleep_ms(60000)", "sleep_ms"),
    "EXPORT_STATE": Case("SELECT sum(1) EXPORT_STATE", "export"),
    # statements other than one SELECT
    "ATTACH": Case("ATTACH '{out}/other.duckdb' AS other", "ATTACH"),
    "DETACH": Case("DETACH DATABASE other", "DETACH"),
    "COPY TO": Case("COPY requests TO '{out}/copy.csv'", "COPY"),
    "COPY FROM": Case("COPY requests FROM '/etc/passwd'", "COPY"),
    "EXPORT DATABASE": Case("EXPORT DATABASE '{out}/export'", "EXPORT"),
    "IMPORT DATABASE": Case("IMPORT DATABASE '{out}/export'", "IMPORT"),
    "INSTALL": Case("INSTALL httpfs", "INSTALL"),
    "LOAD": Case("LOAD httpfs", "LOAD"),
    "SET": Case("SET threads = 1", "SET"),
    "RESET": Case("RESET memory_limit", "RESET"),
    "SET VARIABLE": Case("SET VARIABLE x = 1", "SET"),
    "PRAGMA force_checkpoint": Case("PRAGMA force_checkpoint", "PRAGMA"),
    "PRAGMA table_info": Case("PRAGMA table_info('requests')", "PRAGMA"),
    "CALL": Case("CALL checkpoint()", "CALL"),
    "EXPLAIN ANALYZE DELETE": Case("EXPLAIN ANALYZE DELETE FROM requests", "EXPLAIN"),
    "EXPLAIN": Case("EXPLAIN SELECT 1", "EXPLAIN"),
    "CREATE TABLE": Case("CREATE TABLE t (x INT)", "CREATE"),
    "CREATE VIEW over checkpoint": Case("CREATE VIEW v AS SELECT * FROM checkpoint()", "CREATE"),
    "CREATE MACRO": Case("CREATE MACRO m() AS TABLE SELECT * FROM checkpoint()", "CREATE"),
    "DROP TABLE": Case("DROP TABLE requests", "DROP"),
    "ALTER TABLE": Case("ALTER TABLE requests ADD COLUMN x INT", "ALTER"),
    "DELETE": Case("DELETE FROM requests", "DELETE"),
    "VACUUM": Case("VACUUM", "VACUUM"),
    "USE": Case("USE memory", "USE"),
    "BEGIN": Case("BEGIN TRANSACTION", "TRANSACTION"),
    "COMMIT": Case("COMMIT", "TRANSACTION"),
    "PIVOT without IN (two statements inside)": Case(
        "PIVOT requests ON status USING count(*)", "MULTI"),
    # data-modifying CTEs, several statements, comments
    "DELETE in a CTE": Case("WITH d AS (DELETE FROM requests RETURNING *) FROM d", "DELETE"),
    "INSERT in a CTE": Case("WITH i AS (INSERT INTO requests (request_id) VALUES ('x') "
                            "RETURNING *) SELECT * FROM i", "INSERT"),
    "UPDATE in a CTE": Case("WITH u AS (UPDATE requests SET status = 'x' RETURNING *) "
                            "SELECT * FROM u", "UPDATE"),
    "COPY in a CTE": Case("WITH c AS (COPY requests TO '{out}/c.csv') SELECT * FROM c", "COPY"),
    "two statements": Case("SELECT 1; DELETE FROM requests", "one statement"),
    "two SELECTs": Case("SELECT 1; SELECT 2", "one statement"),
    "line comment ends before a second statement": Case(
        "SELECT 1 -- harmless\n; DROP TABLE requests", "one statement"),
    "block comment then a second statement": Case(
        "SELECT 1 /* ; */; DROP TABLE requests", "one statement"),
    # allowed, and harmless
    "a comment that hides nothing": Case("SELECT 1 -- ; DROP TABLE requests", None, [[1]]),
    "a block comment inside": Case("SELECT /* DROP TABLE requests; */ 2 AS two", None, [[2]]),
    "range()": Case("SELECT count(*) AS n FROM range(10)", None, [[10]]),
    "generate_series()": Case("SELECT sum(generate_series) FROM generate_series(1, 4)",
                              None, [[10]]),
    "unnest()": Case("SELECT * FROM unnest([1, 2, 3])", None, [[1], [2], [3]]),
    "json_each()": Case("SELECT key FROM json_each('{{\"a\": 1}}')", None, [["a"]]),
    "VALUES": Case("VALUES (1), (2)", None, [[1], [2]]),
    "aggregates on requests": Case(
        "SELECT count(*) >= 0, coalesce(max(e2e_s), 0) >= 0 FROM requests", None,
        [[True, True]]),
    "json functions on requests": Case(
        "SELECT count(*) >= 0 FROM requests "
        "WHERE json_array_length(to_json(policy_actions)) >= 0", None, [[True]]),
    "json functions on spans": Case(
        "SELECT count(*) >= 0 FROM spans WHERE json_extract_string(attributes, '$.x') IS NULL",
        None, [[True]]),
    "metadata: duckdb_tables()": Case(
        "SELECT count(*) >= 5 FROM duckdb_tables() WHERE table_name IN "
        "('requests', 'spans', 'engine_stats', 'policy_events', 'overrides')", None, [[True]]),
    "metadata: information_schema": Case(
        "SELECT count(*) > 0 FROM information_schema.columns WHERE table_name = 'requests'",
        None, [[True]]),
    "DESCRIBE": Case("DESCRIBE requests", None),
    "SHOW TABLES": Case("SHOW TABLES", None),
    "SUMMARIZE": Case("SUMMARIZE SELECT 1 AS x", None),
    "PIVOT with IN": Case(
        "PIVOT (SELECT status FROM requests) ON status IN ('ok') USING count(*)", None),
    "a missing table is an ordinary error": Case("SELECT * FROM no_such_table", "no_such_table"),
    "a parse error is one line": Case("SELEC 1", "cannot parse"),
}


def fill(sql: str, sentinel: Path, db: Path, out: Path) -> str:
    return sql.format(sentinel=sentinel, db=db, out=out)


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sandbox") / "secret.csv"
    path.write_text(f"secret\n{SECRET}\n")
    return path


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sandbox-out")


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sandbox-db") / "trace.duckdb"
    with TraceLog(str(path)) as log:
        for i, status in enumerate(["ok", "rejected"]):
            log.add("requests", {"request_id": f"r{i}", "status": status, "e2e_s": 0.5,
                                 "policy_actions": ["shed"],
                                 "arrival_ts": datetime(2026, 11, 30, tzinfo=timezone.utc)})
    return path


def assert_no_trace(text: str, out: Path) -> None:
    assert SECRET not in text  # no file was read into the answer
    assert not any(out.iterdir())  # and none was written


# --- the server -------------------------------------------------------------------------

def post_query(server, sql: str) -> httpx.Response:
    return httpx.post(server.url + "/admin/query", json={"sql": sql}, timeout=60,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def server_state(server) -> list:
    """What a sandbox escape would change: rows, tables and databases, settings."""
    sqls = ["SELECT count(*) FROM requests", "SHOW ALL TABLES",
            "SELECT current_setting('threads'), current_setting('memory_limit')"]
    return [post_query(server, sql).json()["rows"] for sql in sqls]


@pytest.mark.parametrize("name", CASES)
def test_server_sandbox(server, name, sentinel, out_dir):
    case = CASES[name]
    before = server_state(server)
    response = post_query(server, fill(case.sql, sentinel, server.db, out_dir))
    assert_no_trace(response.text, out_dir)
    if case.refused:
        assert response.status_code == 400, f"{name}: passed the gate: {response.text[:200]}"
        message = response.json()["error"]["message"]
        assert case.refused.lower() in message.lower(), message
        assert "\n" not in message
    else:
        assert response.status_code == 200, response.text[:300]
        if case.rows is not None:
            assert response.json()["rows"] == case.rows
    assert server_state(server) == before


# --- the CLI on a file ------------------------------------------------------------------

def file_state(path: Path) -> tuple:
    wal = path.with_name(path.name + ".wal")
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns, wal.exists()


def cli_query(*args: str):
    from tailguard.cli import main

    return CliRunner().invoke(main, ["query", *args], catch_exceptions=True)


@pytest.mark.parametrize("name", CASES)
def test_cli_sandbox(name, trace_file, sentinel, out_dir):
    case = CASES[name]
    before = file_state(trace_file)
    result = cli_query("--db", str(trace_file), "--format", "json",
                       fill(case.sql, sentinel, trace_file, out_dir))
    assert_no_trace(result.output, out_dir)
    if case.refused:
        assert result.exit_code == 2, f"{name}: passed the gate: {result.output[:200]}"
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("tailguard: error: "), result.stderr
        assert case.refused.lower() in lines[0].lower(), lines[0]
    else:
        assert result.exit_code == 0, result.output
        if case.rows is not None:
            assert [list(r.values()) for r in json.loads(result.stdout)] == case.rows
    assert file_state(trace_file) == before


# --- the lists themselves ---------------------------------------------------------------

SUSPICIOUS = re.compile(r"read|write|file|glob|env|setting|sleep|checkpoint|execute|load|"
                        r"install|attach|export|import|extension|secret|log|query|pragma|"
                        r"enable|disable|val$|seed|state|plan|sniff|scan|resource|profil")
# Scalar functions whose names look suspicious but that only compute: reviewed by hand.
REVIEWED_HARMLESS = {
    "log", "log10", "log2", "current_query", "current_query_id", "parse_duckdb_log_message",
    "json_serialize_sql", "json_deserialize_sql", "current_setting", "getvariable",
    "enum_code", "enum_range", "enum_range_boundary", "map_extract_value", "map_contains_value",
    "map_values", "list_value", "array_value", "struct_values", "list_reverse_sort",
    "current_catalog", "normalized_interval", "parse_filename", "pg_conf_load_time",
    "union_value", "map_contains_entry", "json_value", "is_histogram_other_bin",
    "map_entries", "current_schemas", "current_schema",
}


def test_every_table_function_is_allowed_on_purpose():
    """A DuckDB upgrade that adds a table function cannot widen the sandbox: the gate
    allows table functions from a list, and everything on it still exists."""
    conn = duckdb.connect(":memory:")
    table_functions = {row[0] for row in conn.execute(
        "SELECT function_name FROM duckdb_functions() "
        "WHERE function_type IN ('table', 'table_macro')").fetchall()}
    assert TABLE_FUNCTIONS <= table_functions


def test_every_suspicious_scalar_function_is_denied_or_reviewed():
    """The scalar denylist is checked against DuckDB's own catalog: a new function
    whose name suggests files, settings, state or SQL execution fails this test until
    it is denied or reviewed."""
    conn = duckdb.connect(":memory:")
    names = {row[0] for row in conn.execute(
        "SELECT function_name FROM duckdb_functions() "
        "WHERE function_type IN ('scalar', 'aggregate', 'macro')").fetchall()}
    suspicious = {n for n in names if SUSPICIOUS.search(n) and not n.startswith("__")}
    denied = {n for n in suspicious if n in DENIED_FUNCTIONS or n.startswith(DENIED_PREFIXES)}
    assert sorted(suspicious - denied - REVIEWED_HARMLESS) == []
