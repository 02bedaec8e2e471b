"""Read-only SQL over the trace log, shared by the server's writer and the CLI.

Three layers keep a query from changing anything: `observe.sql_gate` lets through one
SELECT whose AST holds no data-modifying CTE, no table function off its allowlist and
no denied scalar function; it runs inside a transaction that is always rolled back;
and the connection has external access switched off so SQL cannot read files or the
network. A file opened here is also opened read-only.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from dataclasses import dataclass
from datetime import date, datetime, time, timezone
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import duckdb

from observe.sql_gate import QueryError, check_read_only

__all__ = ["FORMATS", "QueryError", "QueryResult", "check_read_only", "execute_read_only",
           "format_result", "plain", "query_file", "run_read_only"]

FORMATS = ("table", "csv", "json")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool = False  # more rows existed than max_rows
    types: list[str] | None = None  # DuckDB type names, e.g. "JSON", "TIMESTAMP WITH TIME ZONE"
    truncated_by: str | None = None  # "max_rows" (set with truncated), or "max_bytes" (a
    # server's answer limit)


def run_read_only(conn: duckdb.DuckDBPyConnection, sql: str, params: Any, timeout_s: float,
                  consume: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
    """Check `sql`, run it on `conn` (a connection this call owns) and hand the pending
    result to `consume`, all under `timeout_s`; the transaction is always rolled back."""
    statement = check_read_only(sql)
    timer = threading.Timer(timeout_s, conn.interrupt)
    timer.daemon = True
    try:
        conn.execute("BEGIN TRANSACTION")
    except duckdb.Error as exc:
        raise QueryError(f"trace log unavailable: {exc}") from None
    timer.start()
    try:
        conn.execute(statement, params)
        return consume(conn)
    except duckdb.InterruptException:
        raise QueryError(f"query timed out after {timeout_s:g}s") from None
    except duckdb.Error as exc:
        raise QueryError(" ".join(str(exc).split())) from None
    finally:
        timer.cancel()
        _roll_back(conn)


def execute_read_only(conn: duckdb.DuckDBPyConnection, sql: str, params: Any = None,
                      max_rows: int = 10_000, timeout_s: float = 10.0) -> QueryResult:
    """Run a checked query on `conn` (a connection this call owns), always rolled back."""
    return run_read_only(conn, sql, params, timeout_s, partial(fetch_rows, max_rows=max_rows))


def fetch_rows(conn: duckdb.DuckDBPyConnection, max_rows: int) -> QueryResult:
    """Up to `max_rows` rows of the query pending on `conn`, and whether more existed."""
    description = conn.description or []
    rows = conn.fetchmany(max_rows + 1)
    cut = len(rows) > max_rows
    return QueryResult(columns=[d[0] for d in description], rows=rows[:max_rows],
                       truncated=cut, types=[str(d[1]) for d in description],
                       truncated_by="max_rows" if cut else None)


def _roll_back(conn: duckdb.DuckDBPyConnection) -> None:
    try:
        conn.execute("ROLLBACK")
    except duckdb.Error:
        pass  # a late interrupt may hit the rollback; the cursor is discarded anyway


def query_file(path: str | Path, sql: str, params: Any = None, max_rows: int = 10_000,
               timeout_s: float = 10.0) -> QueryResult:
    """Query a trace-log file that no server holds, read-only. Rows a killed server
    left in the file's spool are loaded into it first (a writer's open does that)."""
    check_read_only(sql)  # refuse bad SQL before touching the file
    if not Path(path).exists():
        raise QueryError(f"no trace log at {path}")
    _load_spool(path)
    try:
        conn = duckdb.connect(str(path), read_only=True,
                              config={"enable_external_access": False})
    except duckdb.Error as exc:
        _refuse_open(path, exc)
    try:
        conn.execute("SET TimeZone = 'UTC'")  # as the server's own query sessions
        return execute_read_only(conn, sql, params, max_rows, timeout_s)
    finally:
        conn.close()


def _load_spool(path: str | Path) -> None:
    from observe.tracelog.spool import SPOOL_SUFFIX  # the trace-log package imports us
    from observe.tracelog.store import load_spool

    spool = Path(f"{path}{SPOOL_SUFFIX}")
    if not spool.is_file() or spool.stat().st_size == 0:
        return
    try:
        load_spool(str(path))
    except duckdb.Error as exc:
        _refuse_open(path, exc)


def _refuse_open(path: str | Path, exc: duckdb.Error) -> None:
    if "lock" in str(exc).lower():
        raise QueryError(f"{path} is held by a running tailguard server; "
                         "query through it with --url") from None
    raise QueryError(f"cannot open {path}: {exc}") from None


# --- output --------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """A JSON-ready form of one cell: timestamps as ISO-8601 (UTC when zoned)."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # Decimal, UUID, interval, ...


def _text(value: Any, null: str) -> str:
    cell = plain(value)
    if cell is None:
        return null
    if isinstance(cell, bool):
        return "true" if cell else "false"
    if isinstance(cell, (list, dict)):
        return json.dumps(cell)
    return str(cell)


def _as_table(result: QueryResult) -> str:
    cells = [[_text(v, "NULL") for v in row] for row in result.rows]
    widths = [max([len(name)] + [len(row[i]) for row in cells])
              for i, name in enumerate(result.columns)]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool)
                   for row in result.rows if row[i] is not None) and bool(result.rows)
               for i in range(len(result.columns))]

    def line(values: Sequence[str], align_numbers: bool) -> str:
        parts = [v.rjust(w) if align_numbers and num else v.ljust(w)
                 for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(result.columns, False), line(["-" * w for w in widths], False)]
    out += [line(row, True) for row in cells]
    noun = "row" if len(cells) == 1 else "rows"
    out.append(f"({len(cells)} {noun}{', truncated' if result.truncated else ''})")
    return "\n".join(out) + "\n"


def _as_csv(result: QueryResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([_text(v, "") for v in row] for row in result.rows)
    return buffer.getvalue()


def _as_json(result: QueryResult) -> str:
    # JSON columns come back from DuckDB as text; nest them as objects again.
    is_json = [t == "JSON" for t in (result.types or [""] * len(result.columns))]
    records = [
        {name: json.loads(v) if (j and isinstance(v, str)) else plain(v)
         for name, v, j in zip(result.columns, row, is_json)}
        for row in result.rows
    ]
    return json.dumps(records, indent=2, ensure_ascii=False) + "\n"


def format_result(result: QueryResult, fmt: str = "table") -> str:
    """Render a result as aligned plain text, CSV or a JSON list of objects."""
    renderers = {"table": _as_table, "csv": _as_csv, "json": _as_json}
    if fmt not in renderers:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return renderers[fmt](result)
