"""Rows on their way into DuckDB: frames, the spool that makes them durable and the
load that inserts them (the writer's two threads drive it: one spools, one loads,
observe/tracelog/writer.py).

A frame is one table's rows of one flush: a small one as the column lists it was
buffered in (a row frame, spooled as JSON: rowframe.py), a large one as Arrow batches.
It is appended to the spool at once and inserted into DuckDB at the next load, one
INSERT per table for every frame waiting; the load first converts all of a table's
row frames in one conversion per column. A load runs beside the spooling (a DuckDB
checkpoint may take seconds; the spool must not wait for it): it inserts the frames
there were when it began, then drops them from the spool, keeping the frames spooled
meanwhile. Rows the spool cannot take (disk full, file too large) stay in memory and
go first next time; rows DuckDB cannot take stay too (in the spool as well, if it took
them), as Arrow. One INSERT is one DuckDB transaction: a failed one leaves no row
behind and a retry duplicates nothing. A frame DuckDB refuses for its content is
dropped alone; the frames beside it go in.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Final

import duckdb
import pyarrow as pa

from observe.schema import TABLES, TableSpec, arrow_batches, arrow_table
from observe.tracelog.rowframe import ROW_FRAME_MAX_ROWS, encode_rows
from observe.tracelog.setup import BATCH_VIEW, DEFAULT_MEMORY_LIMIT, insert_sql, open_writer
from observe.tracelog.spool import Payload, Spool, log, spool_path, unloaded_frames

# Rows per Arrow conversion call: the thread converting holds the GIL inside each call,
# so this bounds how long it can stall the event loop (~2 ms for timestamps).
CONVERT_CHUNK_ROWS: Final = 8192

# What a retry may cure (IOException, TransactionException on commit, OutOfMemory...);
# anything else (a value DuckDB refuses) would fail the same way every time.
_RETRYABLE: Final = (duckdb.OperationalError,)
Count = Callable[[str, int], None]


@dataclass(slots=True, eq=False)
class Frame:
    spec: TableSpec
    batches: list[pa.RecordBatch]  # empty while a row frame
    rows: int
    spooled: bool = False
    spool_at: int = 0  # where in the spool its append began (once spooled)
    columns: dict[str, list] | None = field(default=None, repr=False)  # a row frame's


def row_frame(spec: TableSpec, columns: dict[str, list], rows: int) -> Frame:
    """A flush's rows of one table as a frame: kept as they are when few, else Arrow."""
    if rows <= ROW_FRAME_MAX_ROWS:
        return Frame(spec, [], rows, columns=columns)
    return Frame(spec, list(arrow_batches(spec, columns, rows, CONVERT_CHUNK_ROWS)), rows)


def load_spool(db_path: str) -> None:
    """Load what a killed writer left in a file's spool, as a writer's open does: for a
    reader about to open the file read-only (`tailguard query --db`, the console)."""
    conn = open_writer(db_path, DEFAULT_MEMORY_LIMIT)
    try:
        store = FrameStore(conn, db_path, written=_uncounted, dropped=_uncounted)
        store.load()
        store.close()
    finally:
        conn.close()


def _uncounted(table: str, rows: int) -> None:
    pass


class FrameStore:
    """The frames not in DuckDB yet, oldest first, and the spool. One thread spools and
    one loads at a time (the writer's locks); the frame list and the spool file are
    guarded here, never across an INSERT. `written` and `dropped` count rows out."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, db_path: str, written: Count,
                 dropped: Count) -> None:
        self._conn, self._db_path = conn, db_path
        self._written, self._dropped = written, dropped
        self._insert_sql = {name: insert_sql(spec) for name, spec in TABLES.items()}
        self._failing: set[str] = set()  # "spool", "load": one log line a failure streak
        self._lock = threading.Lock()  # the frame list and the spool file
        self._spool_lock = threading.Lock()  # one spooler at a time (it encodes unlocked)
        self.frames: list[Frame] = []
        self.spool: Spool | None = None
        if (path := spool_path(db_path)) is not None:
            self.frames = [Frame(spec, batches, rows, spooled=True)
                           for spec, batches, rows in unloaded_frames(conn, path)]
            self.spool = Spool(path)
        self.spooled: dict[str, int] = {}  # rows by table durable in the spool, not in DuckDB
        self.writing_since: float | None = None  # monotonic, while spool_new runs
        self._count_spooled()

    def rows(self) -> int:
        with self._lock:
            return sum(frame.rows for frame in self.frames)

    def _count_spooled(self) -> None:
        spooled = dict.fromkeys(TABLES, 0)
        for frame in self.frames:
            if frame.spooled:
                spooled[frame.spec.name] += frame.rows
        self.spooled = spooled  # one assignment: stats() reads it from other threads

    def add(self, spec: TableSpec, columns: dict[str, list], rows: int) -> None:
        """One flush's rows of `spec`'s table, as column lists (no longer mutated)."""
        frame = row_frame(spec, columns, rows)
        with self._lock:
            self.frames.append(frame)

    def spool_new(self) -> bool:
        """Append every frame not in the spool yet; False when the spool refused them."""
        self.writing_since = time.monotonic()  # the wait for a trim's copy counts too
        try:
            return self._spool_new()
        finally:
            self.writing_since = None

    def _spool_new(self) -> bool:
        with self._spool_lock:
            with self._lock:
                fresh = [frame for frame in self.frames if not frame.spooled]
            if self.spool is None or not fresh:
                return True
            payloads = [(frame.spec.name, self._payload(frame)) for frame in fresh]
            return self._append(fresh, payloads)

    def _payload(self, frame: Frame) -> Payload:
        """What the spool holds of a frame: a row frame's JSON, else its batches; a row
        frame with a value JSON cannot hold is converted to Arrow here."""
        if (columns := frame.columns) is not None:
            try:
                return encode_rows(frame.spec, columns)
            except (TypeError, ValueError):
                self._to_arrow(frame.spec, [frame])
        return frame.batches

    def _append(self, fresh: list[Frame], payloads: list[tuple[str, Payload]]) -> bool:
        with self._lock:
            at = self.spool.size
            try:
                self.spool.append(payloads)
            except OSError as exc:  # disk full, file too large: keep the rows in memory
                self._failure("spool", exc, "keeping rows in memory until it recovers")
                return False
            for frame in fresh:
                frame.spooled, frame.spool_at = True, at
            self._count_spooled()
            self._recovered("spool")
            return True

    def load(self) -> bool:
        """Insert the frames there are now, one INSERT per table, and drop them from the
        spool. False when a table's INSERT failed: its frames and later tables' wait."""
        with self._lock:
            frames = list(self.frames)
        for spec in TABLES.values():
            mine = [frame for frame in frames if frame.spec is spec]
            if mine and not self._load_table(spec, mine):
                return False
        self._trim_spool()
        return True

    def _trim_spool(self) -> None:
        """Drop what is loaded from the spool: all of it, or the part before the first
        frame spooled while the load ran (and kept for the next one)."""
        with self._lock:
            if self.spool is None:
                return
            kept = [frame for frame in self.frames if frame.spooled]
            if not kept:
                self.spool.clear()
                return
            cut = min(frame.spool_at for frame in kept)
            if self.spool.drop_before(cut):
                for frame in kept:
                    frame.spool_at -= cut

    def _to_arrow(self, spec: TableSpec, frames: list[Frame]) -> None:
        """The row frames among `frames` into Arrow, in one conversion per column: each
        keeps its slice of the result (no copy) and lets its lists go, so that rows a
        failing load keeps wait as Arrow."""
        # (frame, its lists) taken at once: the other thread may convert it meanwhile
        waiting = [(frame, columns) for frame in frames if (columns := frame.columns)]
        if not waiting:
            return
        merged = {name: list(chain.from_iterable(columns[name] for _, columns in waiting))
                  for name in spec.column_names}
        table = arrow_table(spec, merged, sum(frame.rows for frame, _ in waiting),
                            CONVERT_CHUNK_ROWS)
        at = 0
        with self._lock:
            for frame, _ in waiting:  # batches first: a spooler reading unlocked sees one
                frame.batches = table.slice(at, frame.rows).to_batches()
                frame.columns, at = None, at + frame.rows

    def _load_table(self, spec: TableSpec, frames: list[Frame]) -> bool:
        """Insert `frames` in one transaction; False when they are kept for a retry."""
        rows = sum(frame.rows for frame in frames)
        self._to_arrow(spec, frames)
        try:
            self._insert(spec, [batch for frame in frames for batch in frame.batches])
        except _RETRYABLE as exc:  # disk full, file too large, read-only: keep the rows
            self._failure("load", exc, "keeping rows in memory until it recovers")
            return False
        except Exception as exc:  # a value DuckDB refuses: a retry would fail the same
            if len(frames) > 1:  # find the frame it refuses; the others go in
                return all(self._load_table(spec, [frame]) for frame in frames)
            self._forget(frames)
            self._dropped(spec.name, rows)
            self._failure("load", exc, f"dropped {rows} {spec.name} rows")
            return True
        self._forget(frames)  # before counting them written: stats() never sees them twice
        self._written(spec.name, rows)
        self._recovered("load")
        return True

    def _forget(self, frames: list[Frame]) -> None:
        gone = set(map(id, frames))
        with self._lock:
            self.frames = [frame for frame in self.frames if id(frame) not in gone]
            self._count_spooled()

    def _insert(self, spec: TableSpec, batches: list[pa.RecordBatch]) -> None:
        reader = pa.RecordBatchReader.from_batches(spec.arrow_schema, batches)
        self._conn.register(BATCH_VIEW, reader)
        try:
            self._conn.execute(self._insert_sql[spec.name])
        finally:
            self._conn.unregister(BATCH_VIEW)

    def give_up(self) -> tuple[int, int]:
        """At a close while writes fail: count the frames the spool never took as
        dropped. Returns (rows lost, rows left in the spool for the next open)."""
        with self._lock:
            frames, self.frames = self.frames, []
        lost = [frame for frame in frames if not frame.spooled]
        for frame in lost:
            self._dropped(frame.spec.name, frame.rows)
        lost_rows = sum(frame.rows for frame in lost)
        return lost_rows, sum(frame.rows for frame in frames) - lost_rows

    def close(self) -> None:
        with self._lock:
            if self.spool is not None:
                self.spool.close()

    def _failure(self, sink: str, exc: Exception, what: str) -> None:
        if sink not in self._failing:  # one line per failure streak, not one per flush
            self._failing.add(sink)
            log.error("trace log %s: %s failed, %s: %s: %s", self._db_path,
                      "write" if sink == "load" else "spool write", what,
                      type(exc).__name__, exc)

    def _recovered(self, sink: str) -> None:
        if sink in self._failing:
            self._failing.discard(sink)
            log.warning("trace log %s: %s recovered", self._db_path,
                        "writes" if sink == "load" else "spool writes")
