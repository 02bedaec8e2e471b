"""The trace-log writer: rows in from the event loop, Arrow batches out to DuckDB.

`add()` only appends to per-table column lists under a lock (a few microseconds, no
I/O), so the server may call it from the asyncio loop. A daemon thread takes those
lists every `flush_interval_s` (sooner when a table's buffer fills) and appends them
to the spool beside the file, where they are durable (a few rows as JSON, many as
Arrow batches: store.py); every `load_interval_s` (sixty flushes) or once `LOAD_ROWS`
wait, before any read and at close, another inserts them into DuckDB, one INSERT per
table (store.py): 2-5 ms of CPU whatever its size, a spool append a tenth of that. A reader sees every row of every
completed flush; `flush()` puts everything into DuckDB now. The writer never raises a
write failure into `add()`.

Rows not in DuckDB count against `max_pending_rows`: past it `add()` drops the *new*
rows, so a long outage keeps its oldest. `dropped` counts rows lost for good: refused
by `add()`, refused by DuckDB for their content, or neither in DuckDB nor in the spool
at `close()`. The configuration and how the file is opened: setup.py.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, TypeVar

import duckdb

from observe.query import QueryError, QueryResult, fetch_rows, run_read_only
from observe.schema import TABLES, TableSpec, warm_up_conversion
from observe.tracelog.setup import LOAD_ROWS, TraceLogConfig, open_writer
from observe.tracelog.store import CONVERT_CHUNK_ROWS, FrameStore

__all__ = ["CONVERT_CHUNK_ROWS", "TraceLog"]
T = TypeVar("T")

log = logging.getLogger("observe.tracelog")


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
                 memory_limit: str | None = None, load_interval_s: float | None = None) -> None:
        self.path = str(path)
        self.config = TraceLogConfig(flush_interval_s, max_buffer_rows, max_pending_rows,
                                     memory_limit, load_interval_s)
        self._conn = open_writer(self.path, self.config.memory_limit)
        self._reader = self._conn.cursor()  # query() cursors hang off this one
        self._buffers = {name: _TableBuffer(spec) for name, spec in TABLES.items()}
        self._lock = threading.Lock()  # buffers and counters
        self._flush_lock = threading.Lock()  # taking the buffers and spooling them
        self._load_lock = threading.Lock()  # the writer connection (after _flush_lock)
        self._reader_lock = threading.Lock()
        self.written = dict.fromkeys(TABLES, 0)
        self.dropped = dict.fromkeys(TABLES, 0)
        self._store = FrameStore(self._conn, self.path, self._count_written, self._drop)
        self._pending = self._store.rows()  # spooled before an unclean stop
        self._flushes = self._loads = 0
        self._last_flush_s = self._last_load_s = 0.0
        # Monotonic starts of the flush running now and of the last that spooled all.
        self._flush_began = self._durable_before = None  # type: float | None
        self._closed = False
        if self._pending:
            log.warning("trace log %s: loading %d rows spooled before an unclean stop",
                        self.path, self._pending)
            self._store.load()
        warm_up_conversion()
        self._wake, self._load_wake, self._stop = (threading.Event() for _ in range(3))
        self._threads = [
            threading.Thread(target=self._run, name="tailguard-tracelog", daemon=True),
            threading.Thread(target=self._run_loads, name="tailguard-tracelog-load",
                             daemon=True)]
        for thread in self._threads:
            thread.start()

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
        """Put every buffered and kept row into DuckDB now. False when a write failed:
        what it could not write stays kept."""
        with self._flush_lock:
            spooled = self._spool()
            with self._load_lock:
                return self._load() and spooled

    def _spool(self) -> bool:
        """Take the buffered rows and make them durable in the spool; a writer behind
        leaves them to the load instead (caller holds _flush_lock)."""
        self._flush_began = started = time.monotonic()
        taken = self._take_buffers()
        behind = (waiting := self._store.rows()) >= self.config.max_buffer_rows
        if behind:
            # Behind (bulk rows): DuckDB takes them next and its commit makes them
            # durable; spooling them first doubled such a flush's time.
            self._load_wake.set()
            ok = True
        else:
            ok = self._store.spool_new()
            if ok and waiting >= LOAD_ROWS:  # due before its interval
                self._load_wake.set()
        with self._lock:
            if taken:
                self._flushes += 1
                self._last_flush_s = time.monotonic() - started
            if ok and not behind and self._store.spool is not None:
                self._durable_before = started  # every row added before it
            self._flush_began = None
        return ok

    def _load(self) -> bool:
        """Everything kept into DuckDB; what it refuses is spooled if it is not yet
        (caller holds _load_lock)."""
        started = time.perf_counter()
        ok = self._store.load()
        if not ok:
            self._store.spool_new()
        with self._lock:
            self._loads += 1
            self._last_load_s = time.perf_counter() - started
        return ok

    def _take_buffers(self) -> int:
        taken = 0
        for buffer in self._buffers.values():
            with self._lock:
                columns, rows = buffer.take()
            if rows:
                self._store.add(buffer.spec, columns, rows)
                taken += rows
        return taken

    def _load_spooled(self) -> None:
        """Before a read: what completed flushes spooled goes into DuckDB."""
        with self._load_lock:
            if self._store.frames and not self._closed:
                self._store.load()

    def _count_written(self, table: str, rows: int) -> None:
        with self._lock:
            self.written[table] += rows
            self._pending -= rows

    def _drop(self, table: str, rows: int) -> None:
        with self._lock:
            self.dropped[table] += rows
            self._pending -= rows

    def _run(self) -> None:
        interval = wait = self.config.flush_interval_s
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            started = time.monotonic()
            with self._flush_lock:
                self._spool()
            # The next one an interval after this one began: a slow flush (a stalled
            # fdatasync) does not push the later ones back.
            wait = max(0.0, interval - (time.monotonic() - started))

    def _run_loads(self) -> None:
        while not self._stop.is_set():
            self._load_wake.wait(self.config.load_interval_s)
            self._load_wake.clear()
            if self._stop.is_set():
                return
            with self._load_lock:
                if self._store.frames:
                    self._load()

    # --- lifecycle and reading -------------------------------------------------------
    def close(self) -> None:
        """Flush what is buffered and kept, stop the thread and close the file; rows
        that still cannot be written or spooled are counted as dropped. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        self._load_wake.set()
        for thread in self._threads:
            thread.join()
        if not self.flush():  # the disk never came back: what is kept is lost now
            lost, spooled = self._store.give_up()
            log.error("trace log %s: closed while writes fail; %d rows lost, %d left in "
                      "the spool for the next open", self.path, lost, spooled)
        with self._flush_lock, self._load_lock, self._reader_lock:
            self._store.close()
            self._conn.close()

    def with_writer(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """Flush, then run `fn` on a connection of its own to this database while no
        load can write (archiving moves rows out in its own transaction). `add()` keeps
        buffering and the spool keeps taking flushes meanwhile. The connection has
        external access switched off."""
        self.flush()
        with self._load_lock:
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
        """Rows by table written (in DuckDB), dropped (lost for good) and spooled
        (in the spool, not in DuckDB yet); pending: not in DuckDB yet. Every row added
        more than `last_flush_age_s` ago is durable; a slow disk shows in
        `spool_write_running_s` (docs/trace-log.md)."""
        now = time.monotonic()
        with self._lock:
            began, durable = self._flush_began, self._durable_before
            writing = self._store.writing_since
            return {"last_flush_age_s": None if durable is None else now - durable,
                    "flush_running_s": 0.0 if began is None else now - began,
                    "spool_write_running_s": 0.0 if writing is None else now - writing,
                    "rows_written": dict(self.written), "rows_dropped": dict(self.dropped),
                    "flushes": self._flushes, "last_flush_s": self._last_flush_s,
                    "loads": self._loads, "last_load_s": self._last_load_s,
                    "pending_rows": self._pending,
                    "rows_spooled": dict(self._store.spooled)}

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
        self._load_spooled()
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
