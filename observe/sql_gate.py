"""The SQL gate: which user queries may run on the trace log at all.

A statement passes when it parses as exactly one SELECT (DESCRIBE, SHOW, SUMMARIZE and
VALUES parse as one) and a walk of DuckDB's own serialized AST (`json_serialize_sql`)
finds nothing on the lists below, at any depth: subqueries, CTEs, lateral joins, set
operations, lambdas and window clauses are all plain nodes of the same tree.

- Table functions: an allowlist. DuckDB has ~130 of them and most touch the outside
  world or the engine (`checkpoint`, `read_*`, `glob`, `query`, `enable_logging`,
  `json_execute_serialized_sql`, `duckdb_settings`, ...); each release adds more. A
  new one stays refused until someone reads what it does and lists it here.
- Scalar and aggregate functions: a denylist (names and prefixes). There are ~1000,
  nearly all pure, and every query the server itself runs (SLO status, training,
  forecasts) uses them; an allowlist would refuse ordinary SQL with each release.
  tests/test_sql_sandbox.py checks the denylist against DuckDB's catalog: a function
  whose name suggests files, settings, state or SQL execution fails that test until
  it is denied or reviewed as harmless.
- A table named by a string (`FROM '/etc/passwd'`) is a file read by replacement
  scan: only plain identifiers may name tables.

`current_setting` may read the settings in READABLE_SETTINGS (others can hold
credentials, e.g. `s3_secret_access_key`). The gate is one layer of three: the query
also runs in a transaction that is rolled back, on a connection with external access
off (which still lets `read_blob` read the database's own file).
"""

from __future__ import annotations

import json
import re
import threading
from functools import cache
from typing import Any, Final, Iterator

import duckdb


class QueryError(Exception):
    """A query was refused or failed; the message is meant for the user."""


# Table functions a query may call: they compute, or read only the catalog.
TABLE_FUNCTIONS: Final = frozenset({
    "range", "generate_series", "unnest", "json_each", "json_tree", "pragma_table_info",
    "duckdb_tables", "duckdb_columns", "duckdb_views", "duckdb_schemas", "duckdb_types",
    "duckdb_functions", "duckdb_constraints", "duckdb_indexes", "duckdb_keywords",
    "duckdb_memory",  # buffer memory by tag (bench/reliability/soak.py samples it)
})
# Scalar/aggregate functions that read the environment or files, change state that a
# rollback does not undo, run or plan other SQL, sleep, or decode raw internal state.
DENIED_FUNCTIONS: Final = frozenset({
    "getenv", "nextval", "currval", "setval", "setseed", "write_log", "sleep_ms",
    "pg_sleep", "json_serialize_plan", "json_execute_serialized_sql", "query",
    "query_table", "checkpoint", "force_checkpoint", "finalize", "combine",
    "combine_aggr", "to_aggregate_state", "variant_bytes_to_variant", "glob",
    "sniff_csv", "install", "load", "attach", "detach", "export_state",
})
DENIED_PREFIXES: Final = ("read_", "write_", "pragma_", "parquet_", "enable_", "disable_",
                          "json_execute", "duckdb_", "__")
READABLE_SETTINGS: Final = frozenset({"timezone", "calendar", "memory_limit", "threads",
                                      "worker_threads", "default_order",
                                      "enable_external_access", "lock_configuration"})
_FIRST_WORD = re.compile(r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?\*/)*([A-Za-z]+)", re.DOTALL)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
# Query nodes a SELECT is built of; a CTE may also hold DELETE_QUERY_NODE,
# INSERT_QUERY_NODE, UPDATE_QUERY_NODE or COPY_QUERY_NODE (`WITH x AS (COPY ...)`).
_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE",
                          "CTE_NODE"})


@cache
def _parser() -> tuple[duckdb.DuckDBPyConnection, threading.Lock]:
    # A private in-memory connection: parsing must not depend on any trace-log file.
    conn = duckdb.connect(":memory:", config={"enable_external_access": False})
    return conn, threading.Lock()


def check_read_only(sql: str) -> str:
    """Return the single statement in `sql` if the gate lets it run; QueryError otherwise."""
    statement, ast = _parse(sql)
    for node in _nodes(ast):
        _check_node(node)
    return statement


def _parse(sql: str) -> tuple[str, dict]:
    conn, lock = _parser()
    with lock:
        try:
            statements = conn.extract_statements(sql)
        except duckdb.Error as exc:
            raise QueryError(f"cannot parse query: {' '.join(str(exc).split())}") from None
        if len(statements) != 1:
            raise QueryError(f"expected exactly one statement, got {len(statements)}")
        kind = statements[0].type
        # EXPLAIN is refused too: EXPLAIN ANALYZE executes its statement.
        if kind != duckdb.StatementType.SELECT:
            word = _first_word(statements[0].query)
            what = kind.name if word in (kind.name, "") else f"{word} (a {kind.name} statement)"
            raise QueryError(f"only read-only SELECT queries are allowed, not {what}")
        ast = json.loads(conn.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if ast.get("error"):
        raise QueryError(f"only read-only SELECT queries are allowed "
                         f"({ast.get('error_message', 'not serializable')})")
    return statements[0].query, ast


def _first_word(statement: str) -> str:
    match = _FIRST_WORD.match(statement)
    return match.group(1).upper() if match else ""


def _nodes(tree: Any) -> Iterator[dict]:
    """Every object in the AST, depth first, without recursion (deep SQL is fine)."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(value for key, value in item.items() if key != "function")
            if item.get("type") == "TABLE_FUNCTION":  # its arguments, not its name
                stack.append((item.get("function") or {}).get("arguments", []))
            elif isinstance(item.get("function"), (dict, list)):
                stack.append(item["function"])
        elif isinstance(item, list):
            stack.extend(item)


def _check_node(node: dict) -> None:
    kind = node.get("type")
    if isinstance(kind, str) and kind.endswith("_NODE") and kind not in _QUERY_NODES:
        what = kind.removesuffix("_NODE").removesuffix("_QUERY")
        raise QueryError(f"data-modifying statements are not allowed ({what})")
    if kind == "TABLE_FUNCTION":
        _check_table_function(node.get("function") or {})
    elif kind == "BASE_TABLE" or (kind == "SHOW_REF" and node.get("show_type") == "SHOW"):
        _check_table_name(node.get("table_name") or "x")
    elif node.get("class") == "FUNCTION":
        _check_function(node)
    elif node.get("class") == "WINDOW" and isinstance(node.get("function_name"), str):
        _check_name(node["function_name"])


def _check_table_function(function: dict) -> None:
    name = str(function.get("function_name", "")).lower()
    if name not in TABLE_FUNCTIONS:
        raise QueryError(f"table function {name}() is not allowed; allowed: "
                         f"{', '.join(sorted(TABLE_FUNCTIONS))}")


def _check_table_name(name: str) -> None:
    if not _IDENTIFIER.fullmatch(name):
        raise QueryError(f"reading a file by name is not allowed ({name!r}); "
                         "tables are named by plain identifiers")


def _check_function(node: dict) -> None:
    name = _check_name(str(node.get("function_name", "")))
    if node.get("export_state"):
        raise QueryError(f"EXPORT_STATE is not allowed ({name})")
    if name == "current_setting":
        _check_setting(node.get("arguments") or [])


def _check_name(raw: str) -> str:
    name = raw.lower()
    if name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES):
        raise QueryError(f"function {name}() is not allowed: it reaches outside the query "
                         "(files, settings, state or other SQL)")
    return name


def _check_setting(arguments: list) -> None:
    first = arguments[0] if arguments else {}
    first = first.get("expression", first) if isinstance(first, dict) else {}
    literal = first.get("literal") or {} if first.get("class") == "CONSTANT" else {}
    setting = str(literal.get("text", "")).lower() if literal.get("kind") == "STRING" else ""
    if setting not in READABLE_SETTINGS:
        raise QueryError(f"current_setting() may read only "
                         f"{', '.join(sorted(READABLE_SETTINGS))} (as a string literal)")
