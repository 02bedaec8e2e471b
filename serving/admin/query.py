"""`POST /admin/query`: users' read-only SQL, bounded so it cannot starve the server.

- At most `slots` user queries run at once (argument -> $TAILGUARD_ADMIN_QUERY_SLOTS ->
  2); one more is answered 429 with `Retry-After` at once. The server's own readers
  (SLO status, training, forecasts) call `TraceLog.query` directly and never wait here.
- Each query keeps the trace log's timeout (10 s) and DuckDB memory limit.
- The answer is bounded in rows (`max_rows`) and in bytes (`max_bytes`, default 16 MiB,
  at most 64 MiB): rows are fetched in chunks sized to the bytes left and encoded to
  JSON in the worker thread, never on the event loop, then streamed. A cut answer says
  `"truncated": true` and `"truncated_by": "max_rows" | "max_bytes"`.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import duckdb
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from observe import settings
from observe.query import QueryError, plain
from observe.settings import TAILGUARD_ADMIN_QUERY_SLOTS
from serving.errors import ApiError

DEFAULT_QUERY_SLOTS: Final = 2
DEFAULT_QUERY_ROWS: Final = 10_000
MAX_QUERY_ROWS: Final = 100_000
DEFAULT_QUERY_BYTES: Final = 16 * 1024 * 1024
MAX_QUERY_BYTES: Final = 64 * 1024 * 1024
QUERY_TIMEOUT_S: Final = 10.0
RETRY_AFTER_S: Final = 1
FETCH_ROWS_MAX: Final = 2048  # rows per fetch, fewer when rows are wide ...
FETCH_BYTES: Final = 1024 * 1024  # ... so that one fetch is about this much JSON
_TAIL_BYTES: Final = 64  # room kept for `],"truncated":...}`


@dataclass(slots=True)
class AdminQueryConfig:
    slots: int | None = None  # None: $TAILGUARD_ADMIN_QUERY_SLOTS, else 2
    timeout_s: float = QUERY_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.slots is None:
            self.slots = settings.number(TAILGUARD_ADMIN_QUERY_SLOTS, DEFAULT_QUERY_SLOTS, int,
                                         complaint="{name} must be an integer, got {raw!r}")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True, slots=True)
class QueryRequest:
    sql: str
    max_rows: int
    max_bytes: int


def add_query_route(router: APIRouter, runtime, config: AdminQueryConfig | None = None) -> None:
    """Register `POST /query` on the admin router, with threads of its own."""
    config = config or AdminQueryConfig()
    slots = threading.BoundedSemaphore(config.slots)
    pool = ThreadPoolExecutor(config.slots, thread_name_prefix="tailguard-admin-query")

    @router.post("/query")
    async def query(request: Request):
        try:
            asked = parse_query_body(await request.json())
        except ApiError as exc:
            return exc.response()
        except (ValueError, RecursionError) as exc:
            return ApiError(400, "invalid_request", f"invalid body: {exc}").response()
        if not slots.acquire(blocking=False):
            return _busy(config.slots)
        job = pool.submit(_answer, runtime.tracelog, asked, config.timeout_s)
        # The slot comes back when DuckDB is done, even if this request is cancelled.
        job.add_done_callback(lambda _: slots.release())
        try:
            parts = await asyncio.wrap_future(job)
        except QueryError as exc:
            return ApiError(400, "invalid_query", str(exc)).response()
        return StreamingResponse(iter(parts), media_type="application/json")


def _busy(limit: int):
    return ApiError(429, "too_many_queries",
                    f"{limit} admin queries are running; retry in {RETRY_AFTER_S}s",
                    headers={"Retry-After": str(RETRY_AFTER_S)}).response()


def _answer(tracelog, asked: QueryRequest, timeout_s: float) -> list[bytes]:
    return tracelog.read(asked.sql, lambda cursor: encode_answer(
        cursor, asked.max_rows, asked.max_bytes), timeout_s=timeout_s)


def parse_query_body(body: Any) -> QueryRequest:
    """`{"sql": str, "max_rows"?: 1..100000, "max_bytes"?: 1024..64 MiB}`; ApiError else."""
    sql = body.get("sql") if isinstance(body, dict) else None
    if not isinstance(sql, str) or not sql.strip():
        raise ApiError(400, "invalid_request", "body must be {\"sql\": \"SELECT ...\"}")
    max_rows = _bounded(body, "max_rows", DEFAULT_QUERY_ROWS, 1, MAX_QUERY_ROWS)
    max_bytes = _bounded(body, "max_bytes", DEFAULT_QUERY_BYTES, 1024, MAX_QUERY_BYTES)
    return QueryRequest(sql, max_rows, max_bytes)


def _bounded(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, "invalid_request", f"{name} must be an integer in {low}..{high}")
    return value


# --- the answer, built in the worker thread ---------------------------------------------

def encode_answer(cursor: duckdb.DuckDBPyConnection, max_rows: int,
                  max_bytes: int) -> list[bytes]:
    """The JSON answer to the query pending on `cursor`, in parts of at most one fetch
    each: `{"columns": [...], "rows": [...], "truncated": bool, "truncated_by": ...}`."""
    columns = [d[0] for d in cursor.description or []]
    parts = [b'{"columns":' + _dumps(columns) + b',"rows":[']
    budget = max_bytes - len(parts[0]) - _TAIL_BYTES
    rows, used, cut = 0, 0, None
    fetch = 64
    while cut is None:
        chunk = cursor.fetchmany(min(fetch, max_rows + 1 - rows))
        if not chunk:
            break
        if rows + len(chunk) > max_rows:
            chunk, cut = chunk[:max_rows - rows], "max_rows"
        encoded, fits = _encode_rows(chunk, budget - used, first=rows == 0)
        if fits < len(chunk):
            cut = "max_bytes"
        if encoded:
            parts.append(encoded)
        rows, used = rows + fits, used + len(encoded)
        fetch = _next_fetch(budget - used, used / max(rows, 1))
    parts.append(b'],"truncated":' + _dumps(cut is not None)
                 + b',"truncated_by":' + _dumps(cut) + b'}')
    return parts


def _next_fetch(bytes_left: int, bytes_per_row: float) -> int:
    """About FETCH_BYTES of rows, and no more than the answer has room for: wide rows
    never sit in memory far beyond what the answer carries."""
    wanted = min(bytes_left, FETCH_BYTES) / max(bytes_per_row, 1.0)
    return max(1, min(FETCH_ROWS_MAX, int(wanted) + 1))


def _encode_rows(chunk: list[tuple], room: int, first: bool) -> tuple[bytes, int]:
    """(JSON of the leading rows of `chunk` that fit in `room` bytes, how many)."""
    if not chunk:
        return b"", 0
    sep = b"" if first else b","
    whole = sep + _dumps([[plain(v) for v in row] for row in chunk])[1:-1]
    if len(whole) <= room:
        return whole, len(chunk)
    out, used = [], 0
    for row in chunk:
        encoded = (sep if not out else b",") + _dumps([plain(v) for v in row])
        if used + len(encoded) > room:
            break
        out.append(encoded)
        used += len(encoded)
    return b"".join(out), len(out)


def _dumps(value: Any) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN and infinities are not JSON: send them as strings
        text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"))
    return text.encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
