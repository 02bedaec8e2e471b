"""The spool (`<file>.spool`, beside the DuckDB file as its WAL is): where a flush's
rows become durable. One `write` and one `fdatasync` of frames (a row frame's JSON,
rowframe.py, or an Arrow IPC stream) costs about a tenth of the CPU of a DuckDB INSERT,
which costs 2-5 ms whatever its size
(`python -m bench.tracelog.spool_cost`). The writer moves spooled rows into DuckDB
every load interval (sixty flushes), before any read and at close, then drops them from
the spool (observe/tracelog/store.py). A flush of `max_buffer_rows` or more (a writer
behind) goes into DuckDB at once instead, whose commit then makes it durable.

A writer that opens a file whose spool still holds frames (a kill -9, a power cut)
loads them first. Each frame went into DuckDB in one INSERT, so a frame whose first
row is already in its table (by the table's key) was loaded before the crash and is
skipped: nothing is lost and nothing is written twice. A frame cut short by the crash
was never a completed flush and is not there; nor is anything after a frame that does
not decode (a damaged file), where the read stops.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import Final, Iterable

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc

from observe.schema import TABLES, TableSpec
from observe.tracelog.rowframe import decode_rows

# A frame: its table's name and its rows, as Arrow batches or a row frame's JSON bytes.
Payload = list[pa.RecordBatch] | bytes

SPOOL_SUFFIX: Final = ".spool"
_FRAME: Final = struct.Struct("<IQ")  # a frame's table-name length, its payload's length
# Set in the name length: the payload is a row frame's JSON (rowframe.py), not an IPC
# stream. A spool of this version read by an older tailguard stops at the first one.
_ROW_FRAME: Final = 1 << 31
# Given, so that each stream does not read its defaults from the environment again.
_IPC_OPTIONS: Final = ipc.IpcWriteOptions()

log = logging.getLogger("observe.tracelog")


def spool_path(db_path: str) -> str | None:
    """Where a trace-log file's spool lives (beside it, as DuckDB's WAL); None in memory."""
    return None if db_path in ("", ":memory:") or db_path.startswith(":memory:") \
        else db_path + SPOOL_SUFFIX


class Spool:
    """An append-only file of frames, each one table's Arrow IPC stream. A failed append
    cuts the file back to its last whole frame and raises; the caller keeps the rows."""

    __slots__ = ("path", "size", "_fd")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = self._open(path, os.O_CREAT)
        self.size = os.fstat(self._fd).st_size

    @staticmethod
    def _open(path: str, flags: int) -> int:
        return os.open(path, os.O_RDWR | os.O_APPEND | flags, 0o644)

    def append(self, frames: Iterable[tuple[str, Payload]]) -> None:
        data = memoryview(encode_frames(frames))
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
            os.fdatasync(self._fd)  # what DuckDB's commit did for these rows before
        except OSError:
            self._cut(self.size)
            raise
        self.size += len(data)

    def clear(self) -> None:
        """Empty it once every frame is in DuckDB. If this fails the frames stay, and a
        later recovery finds them loaded and skips them."""
        self._cut(0)

    def drop_before(self, offset: int) -> bool:
        """Drop the frames before `offset` (loaded), keeping the later ones: these are
        copied into a new file that then replaces this one, so a crash leaves either
        file, each of whole frames. False when it could not (the frames all stay; a
        recovery skips the loaded ones)."""
        if offset <= 0:
            return False
        fresh = self.path + ".new"
        try:
            tail = os.pread(self._fd, self.size - offset, offset)
            fd = self._open(fresh, os.O_CREAT | os.O_TRUNC)
        except OSError:
            return False
        try:
            view = memoryview(tail)
            while view:
                view = view[os.write(fd, view):]
            os.fdatasync(fd)
            os.replace(fresh, self.path)
        except OSError:
            os.close(fd)
            Path(fresh).unlink(missing_ok=True)
            return False
        os.close(self._fd)
        self._fd, self.size = fd, len(tail)
        _sync_dir(self.path)  # the rename is durable too: later appends go to this file
        return True

    def _cut(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
            self.size = size
        except OSError:
            pass

    def close(self) -> None:
        os.close(self._fd)
        if self.size == 0:
            Path(self.path).unlink(missing_ok=True)


def _sync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # a crash before the rename is durable leaves the old file: whole frames
    finally:
        os.close(fd)


def encode_frames(frames: Iterable[tuple[str, Payload]]) -> pa.Buffer | bytes:
    """Frames back to back in one buffer of the right size: each stream is measured
    first (no copy) and then written in place once. A growing buffer and the copies to
    bytes cost four times as much: 2.4 s against 0.55 s for a million `requests` rows.
    Row frames alone are joined as bytes: no Arrow code wakes for a quiet second."""
    frames = [(name.encode(), payload) for name, payload in frames]
    if all(isinstance(payload, bytes) for _, payload in frames):
        return b"".join(_row_frame(name, payload) for name, payload in frames)
    sized = [(name, payload, len(payload) if isinstance(payload, bytes)
              else _stream(pa.MockOutputStream(), payload).size())
             for name, payload in frames]
    buffer = pa.allocate_buffer(sum(_FRAME.size + len(name) + size
                                    for name, _, size in sized))
    out = pa.FixedSizeBufferWriter(buffer)
    for name, payload, size in sized:
        if isinstance(payload, bytes):
            out.write(_row_frame(name, payload))
        else:
            out.write(_FRAME.pack(len(name), size) + name)
            _stream(out, payload)
    return buffer


def _row_frame(name: bytes, payload: bytes) -> bytes:
    return _FRAME.pack(len(name) | _ROW_FRAME, len(payload)) + name + payload


def _stream(sink, batches: list[pa.RecordBatch]):
    with ipc.new_stream(sink, batches[0].schema, options=_IPC_OPTIONS) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink


def read_spool(path: str) -> list[tuple[str, pa.Table]]:
    """Every whole frame of a spool, oldest first; a frame cut short by a crash during
    its write, and anything after it, is not there (its flush never completed)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    frames, at = [], 0
    while at + _FRAME.size <= len(data):
        name_len, size = _FRAME.unpack_from(data, at)
        rows_frame, name_len = bool(name_len & _ROW_FRAME), name_len & ~_ROW_FRAME
        start = at + _FRAME.size
        at = start + name_len + size
        if at > len(data):
            break
        name = data[start:start + name_len].decode(errors="replace")
        try:
            table = _decode(name, rows_frame, data[start + name_len:at])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError, RecursionError):
            break  # RecursionError: JSON nested past Python's limit (a hostile file)
        frames.append((name, table))
    return frames


def _decode(name: str, rows_frame: bool, payload: bytes) -> pa.Table:
    if rows_frame:
        return decode_rows(TABLES.get(name), payload)
    return ipc.open_stream(pa.py_buffer(payload)).read_all()


def unloaded_frames(conn: duckdb.DuckDBPyConnection,
                    path: str) -> list[tuple[TableSpec, list[pa.RecordBatch], int]]:
    """The frames of a spool not in DuckDB yet, in the current schema (a newer tailguard
    may have added columns since they were written: NULL there)."""
    unloaded = []
    for name, table in read_spool(path):
        spec = TABLES.get(name)
        if spec is None:
            log.error("trace log spool %s: skipped a frame of unknown table %r", path, name)
        elif table.num_rows and not _loaded(conn, spec, table):
            unloaded.append((spec, _in_schema(spec, table).to_batches(), table.num_rows))
    return unloaded


def _loaded(conn: duckdb.DuckDBPyConnection, spec: TableSpec, table: pa.Table) -> bool:
    first = table.slice(0, 1).to_pylist()[0]
    where = " AND ".join(f"{key} IS NOT DISTINCT FROM ?" for key in spec.key)
    (found,), = conn.execute(f"SELECT count(*) FROM {spec.name} WHERE {where}",
                             [first.get(key) for key in spec.key]).fetchall()
    return found > 0


def _in_schema(spec: TableSpec, table: pa.Table) -> pa.Table:
    present = set(table.schema.names)
    return pa.Table.from_arrays(
        [table.column(f.name) if f.name in present else pa.nulls(table.num_rows, f.type)
         for f in spec.arrow_schema], schema=spec.arrow_schema)
