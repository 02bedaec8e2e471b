"""The trace-log writer: rows in from the event loop, Arrow batches out to DuckDB.

`add()` only appends to per-table column lists under a lock (a few microseconds, no
I/O), so the server may call it from the asyncio loop. A daemon thread turns those
lists into Arrow tables and inserts them every `flush_interval_s`, or sooner when a
table's buffer fills. Tables whose rows come at a steady pace whatever the load
(`PERIODIC_TABLES`: the engine's seconds, the memory forecast) are written every
`periodic_flush_s` (ten flush intervals) instead: an INSERT costs DuckDB 2-3 ms of CPU
whatever its size, and one a second for one row was half of an idle server's CPU.
An explicit `flush()` writes every table. The writer never raises a write failure
into `add()`.

A batch that fails to write for a reason of the disk (DuckDB's OperationalError: disk
full, file too large, read-only file) stays in memory, in order, and is written first
by the next flush; one INSERT is one DuckDB transaction, so a failed one leaves no
row behind and a retry duplicates nothing. Rows kept count against
`max_pending_rows`: once it is reached `add()` drops the *new* rows, so what survives
a long outage is its oldest rows. A batch DuckDB refuses for its content is dropped.
`dropped` counts only rows lost for good: refused by `add()`, refused for content, or
still unwritten at `close()`.

The configuration and how the file is opened: observe/tracelog_setup.py.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Final, TypeVar

import duckdb
import pyarrow as pa

from observe.query import QueryError, QueryResult, fetch_rows, run_read_only
from observe.schema import TABLES, TableSpec, arrow_batches, warm_up_conversion
from observe.tracelog_setup import (
    BATCH_VIEW,
    PERIODIC_TABLES,
    TraceLogConfig,
    insert_sql,
    open_writer,
)

# Rows per Arrow conversion call: the flush thread holds the GIL inside each call,
# so this bounds how long it can stall the event loop (~2 ms for timestamps).
CONVERT_CHUNK_ROWS: Final = 8192
# What a retry may cure (IOException, TransactionException on commit, OutOfMemory...);
# anything else (a value DuckDB refuses) would fail the same way every time.
_RETRYABLE: Final = (duckdb.OperationalError,)
T = TypeVar("T")

log = logging.getLogger(__name__)


class _TableBuffer:
    """One table's pending rows, column-wise, in the table's declared column order."""

    def __init__(self, spec: TableSpec) -> None:
        self.spec = spec
        self.known = frozenset(spec.column_names)
        self.columns: dict[str, list] = {}
        self.rows = 0
        self.take()

    def take(self) -> tuple[dict[str, list], int]:
        """Hand over the buffered columns and start empty ones (caller holds the lock)."""
        taken = (self.columns, self.rows)
        self.columns = {name: [] for name in self.spec.column_names}
        # Bound appends save a lookup per column on the hot path.
        self.appenders = [(values.append, name) for name, values in self.columns.items()]
        self.rows = 0
        return taken


class TraceLog:
    """Buffered, thread-safe writer of the trace-log tables; owns its DuckDB file."""

    def __init__(self, path: str | Path = ":memory:", *, flush_interval_s: float | None = None,
                 max_buffer_rows: int = 50_000, max_pending_rows: int = 1_000_000,
                 memory_limit: str | None = None, periodic_flush_s: float | None = None) -> None:
        self.path = str(path)
        self.config = TraceLogConfig(flush_interval_s, max_buffer_rows, max_pending_rows,
                                     memory_limit, periodic_flush_s)
        self._conn = open_writer(self.path, self.config.memory_limit)
        self._reader = self._conn.cursor()  # query() cursors hang off this one
        self._buffers = {name: _TableBuffer(spec) for name, spec in TABLES.items()}
        # Batches taken from a buffer and not written yet, oldest first (flush thread only).
        self._kept: dict[str, list[tuple[dict[str, list], int]]] = {n: [] for n in TABLES}
        self._insert_sql = {name: insert_sql(spec) for name, spec in TABLES.items()}
        self._lock = threading.Lock()  # buffers and counters
        self._flush_lock = threading.Lock()  # the writer connection
        self._reader_lock = threading.Lock()
        self._pending = 0
        self.written = dict.fromkeys(TABLES, 0)
        self.dropped = dict.fromkeys(TABLES, 0)
        self._flushes = 0
        self._last_flush_s = 0.0
        self._failing = False
        self._closed = False
        self._periodic_due = time.monotonic() + self.config.periodic_flush_s
        warm_up_conversion()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tailguard-tracelog", daemon=True)
        self._thread.start()

    # --- hot path --------------------------------------------------------------------
    def add(self, table: str, row: dict[str, Any]) -> None:
        """Buffer one row; values must not be mutated afterwards. Never does I/O."""
        buffer = self._buffers.get(table)
        if buffer is None:
            raise ValueError(f"unknown trace-log table {table!r}")
        if not row.keys() <= buffer.known:
            unknown = sorted(row.keys() - buffer.known)
            raise ValueError(f"unknown column(s) for {table}: {', '.join(unknown)}")
        get = row.get
        with self._lock:
            if self._pending >= self.config.max_pending_rows or self._closed:
                self.dropped[table] += 1
                return
            for append, name in buffer.appenders:
                append(get(name))
            buffer.rows += 1
            self._pending += 1
            if buffer.rows == self.config.max_buffer_rows:
                self._wake.set()  # let the flusher write it; never inline

    # --- flushing --------------------------------------------------------------------
    def flush(self) -> bool:
        """Write every buffered and kept row now. False when a write failed: that batch
        and every one not tried yet stay kept."""
        return self._flush(self._buffers.values())

    def _flush(self, buffers) -> bool:
        with self._flush_lock:
            started = time.perf_counter()
            written = self._written_total()
            ok = True
            for buffer in buffers:
                with self._lock:
                    columns, rows = buffer.take()
                kept = self._kept[buffer.spec.name]
                if rows:
                    kept.append((columns, rows))
                while ok and kept:  # after one failure, keep the rest without trying
                    ok = self._write(buffer.spec, *kept[0])
                    if ok:
                        kept.pop(0)
            if self._written_total() > written:
                self._flushes += 1
                self._last_flush_s = time.perf_counter() - started
            return ok

    def _written_total(self) -> int:
        with self._lock:
            return sum(self.written.values())

    def _write(self, spec: TableSpec, columns: dict[str, list], rows: int) -> bool:
        """Insert one batch. True when it is done with (written, or refused for its
        content: dropped); False when it failed and is kept for a retry."""
        try:
            # A stream rather than a table: DuckDB inserts one chunk while the next is
            # converted, and the whole batch is never in memory twice.
            batches = arrow_batches(spec, columns, rows, CONVERT_CHUNK_ROWS)
            stream = pa.RecordBatchReader.from_batches(spec.arrow_schema, batches)
            self._conn.register(BATCH_VIEW, stream)
            try:
                self._conn.execute(self._insert_sql[spec.name])
            finally:
                self._conn.unregister(BATCH_VIEW)
        except _RETRYABLE as exc:  # disk full, file too large, read-only: keep the rows
            self._log_failure(exc, "keeping rows in memory until it recovers")
            return False
        except Exception as exc:  # a value DuckDB refuses: a retry would fail the same
            self._drop(spec.name, rows)
            self._log_failure(exc, f"dropped {rows} {spec.name} rows")
            return True
        with self._lock:
            self.written[spec.name] += rows
            self._pending -= rows
        if self._failing:
            self._failing = False
            log.warning("trace log %s: writes recovered", self.path)
        return True

    def _drop(self, table: str, rows: int) -> None:
        with self._lock:
            self.dropped[table] += rows
            self._pending -= rows

    def _log_failure(self, exc: Exception, what: str) -> None:
        if not self._failing:  # one line per failure streak, not one per flush
            self._failing = True
            log.error("trace log %s: write failed, %s: %s: %s",
                      self.path, what, type(exc).__name__, exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            if not self._stop.is_set():
                self._flush(self._due(time.monotonic()))

    def _due(self, now: float) -> list[_TableBuffer]:
        """The buffers a background flush writes: all once `periodic_flush_s` has
        passed, else every table but the periodic ones (unless one is full)."""
        if now >= self._periodic_due:
            self._periodic_due = now + self.config.periodic_flush_s
            return list(self._buffers.values())
        return [b for b in self._buffers.values() if b.spec.name not in PERIODIC_TABLES
                or b.rows >= self.config.max_buffer_rows]

    # --- lifecycle and reading -------------------------------------------------------
    def close(self) -> None:
        """Flush what is buffered and kept, stop the thread and close the file; rows
        that still cannot be written are counted as dropped. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if not self.flush():  # the disk never came back: what is kept is lost now
            lost = {name: sum(rows for _, rows in kept) for name, kept in self._kept.items()}
            for name, rows in lost.items():
                self._drop(name, rows)
                self._kept[name] = []
            log.error("trace log %s: closed while writes fail; %d rows lost", self.path,
                      sum(lost.values()))
        with self._flush_lock, self._reader_lock:
            self._conn.close()

    def with_writer(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Flush, then run `fn` on a connection of its own to this database while no
        flush can write (archiving moves rows out in its own transaction). `add()` keeps
        buffering meanwhile. The connection has external access switched off."""
        self.flush()
        with self._flush_lock:
            if self._closed:
                raise RuntimeError(f"trace log {self.path} is closed")
            conn = self._conn.cursor()
            try:
                return fn(conn)
            finally:
                conn.close()

    def __enter__(self) -> TraceLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"rows_written": dict(self.written), "rows_dropped": dict(self.dropped),
                    "flushes": self._flushes, "last_flush_s": self._last_flush_s,
                    "pending_rows": self._pending}

    def query(self, sql: str, params: Any = None, max_rows: int = 10_000,
              timeout_s: float = 10.0) -> QueryResult:
        """Run one read-only SELECT on this database (what the server's own readers use)."""
        return self.read(sql, partial(fetch_rows, max_rows=max_rows), params, timeout_s)

    def read(self, sql: str, consume: Callable[[duckdb.DuckDBPyConnection], T],
             params: Any = None, timeout_s: float = 10.0) -> T:
        """Run one read-only SELECT on a cursor of its own and return `consume(cursor)`,
        which fetches from the pending result (`/admin/query` encodes JSON there).
        DuckDB's thread pool and memory limit are per database, not per cursor: a
        user query shares them with the flush; callers bound how many run at once."""
        with self._reader_lock:
            if self._closed:
                raise QueryError("trace log is closed")
            try:
                cursor = self._reader.cursor()
            except duckdb.Error as exc:
                raise QueryError(f"trace log unavailable: {exc}") from None
        try:
            return run_read_only(cursor, sql, params, timeout_s, consume)
        finally:
            cursor.close()
