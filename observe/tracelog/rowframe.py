"""Row frames: a small flush's rows spooled as JSON columns, not Arrow.

A flush of a quiet second holds a few rows, and turning them into Arrow costs a
conversion per column (~75 for the three tables a light server writes each second).
Each wakes code that a second of idling has left cold: on the 2-vCPU machines here a
light second's Arrow conversion and IPC encoding took 8-21 ms of CPU against 2-3 ms
for these JSON bytes (`python -m bench.tracelog.spool_cost`). So a flush of up to
`ROW_FRAME_MAX_ROWS` rows a table is spooled as JSON and kept as Python lists; the
load converts all of a table's waiting row frames in one conversion per column.

The JSON keeps what the Arrow conversion would store: a timestamp given as a datetime
becomes its epoch seconds (a float holds every microsecond of the years 1970-2100
exactly enough to round back), a JSON-typed value is serialised as the conversion
serialises it, and a value JSON cannot hold (bytes, an object) makes the caller
convert that frame to Arrow instead, where such a cell becomes NULL as before.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Final

import pyarrow as pa

from observe.schema import TableSpec, arrow_table, hand_gil_on, json_text

# Above this a flush converts to Arrow at once: its conversion is warm work anyway, and
# a JSON encoding of one column holds the GIL (bounded here to about a millisecond).
ROW_FRAME_MAX_ROWS: Final = 8192


def _epoch_seconds(value: object) -> float:
    if isinstance(value, datetime):  # naive: UTC, as the Arrow conversion reads it
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return aware.timestamp()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_encode: Final = json.JSONEncoder(default=_epoch_seconds, separators=(",", ":")).encode


def encode_rows(spec: TableSpec, columns: dict[str, list]) -> bytes:
    """A row frame's payload, `{"column": [values], ...}`. Raises TypeError or ValueError
    for a value JSON cannot hold. Hands the GIL on between columns, as the Arrow
    conversion does (`hand_gil_on`)."""
    parts, held_since = [], time.perf_counter()
    for name, sql_type in spec.columns:
        values = columns[name]
        if sql_type == "JSON":
            values = [json_text(v) for v in values]
        parts.append(f"{_encode(name)}:{_encode(values)}")
        held_since = hand_gil_on(held_since)
    return ("{" + ",".join(parts) + "}").encode()


def decode_rows(spec: TableSpec | None, payload: bytes) -> pa.Table:
    """A row frame back as an Arrow table in `spec`'s current columns (one it lacks:
    NULL; one it no longer has: dropped); without a spec, its column names and row count
    alone. Raises ValueError for a payload that is not a frame's (the caller stops
    reading there)."""
    columns = json.loads(payload)
    if not isinstance(columns, dict) or not all(isinstance(v, list) for v in columns.values()):
        raise ValueError("a row frame is an object of column lists")
    lengths = {len(values) for values in columns.values()}
    if len(lengths) > 1:
        raise ValueError("a row frame's columns differ in length")
    rows = lengths.pop() if lengths else 0
    if spec is None:  # a table this version does not know: its rows are skipped
        return pa.table({name: pa.nulls(rows) for name in columns})
    return arrow_table(spec, {name: columns.get(name) or [None] * rows
                              for name in spec.column_names}, rows)
