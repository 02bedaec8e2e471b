"""The trace-log tables, defined once.

Each table is one ordered list of (column, DuckDB type) pairs; the DDL, the column
order the writer buffers in and the Arrow schema it flushes with are all derived
from that list, so they cannot drift apart. Columns are only ever added, never
renamed or retyped: `create_schema` adds what an older file lacks, so a newer
tailguard opens an older trace log in place.

`arrow_batches` turns the writer's column lists into that Arrow schema: timestamps may
be aware datetimes or epoch seconds, JSON may be a dict or text, and a value of the
wrong type becomes NULL in its cell instead of costing the whole batch.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Final, Iterator

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

# Arrow types the writer builds each column with. JSON travels as text and is cast
# by DuckDB on insert; timestamps are microseconds, DuckDB's TIMESTAMPTZ resolution.
ARROW_TYPES: Final[dict[str, pa.DataType]] = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BOOLEAN": pa.bool_(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "VARCHAR[]": pa.list_(pa.string()),
}
_TIMESTAMP: Final = ARROW_TYPES["TIMESTAMPTZ"]
# How long the Arrow conversion holds the GIL before it hands it to the event loop.
GIL_SLICE_S: Final = 0.002
# One encoder for every JSON cell: `json.dumps(v, default=str)` builds a new one per call.
_to_json: Final = json.JSONEncoder(default=str).encode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    columns: tuple[tuple[str, str], ...]  # (column name, DuckDB type), in file order
    # Columns that tell one row from every other: how a spool frame is found already
    # loaded after a crash (observe/tracelog/spool.py).
    key: tuple[str, ...] = ()
    column_names: tuple[str, ...] = field(init=False)
    arrow_schema: pa.Schema = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(name for name, _ in self.columns)
        if not self.key or not set(self.key) <= set(names):
            raise ValueError(f"{self.name}: key {self.key} must name its columns")
        arrow = pa.schema([(name, ARROW_TYPES[sql_type]) for name, sql_type in self.columns])
        object.__setattr__(self, "column_names", names)
        object.__setattr__(self, "arrow_schema", arrow)

    def columns_of_type(self, sql_type: str) -> tuple[str, ...]:
        return tuple(name for name, kind in self.columns if kind == sql_type)

    def create_sql(self) -> str:
        body = ", ".join(f"{name} {sql_type}" for name, sql_type in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({body})"


REQUESTS: Final = TableSpec("requests", (
    ("request_id", "VARCHAR"), ("trace_id", "VARCHAR"), ("arrival_ts", "TIMESTAMPTZ"),
    ("model", "VARCHAR"), ("endpoint", "VARCHAR"), ("stream", "BOOLEAN"),
    ("priority", "VARCHAR"), ("status", "VARCHAR"), ("http_status", "INTEGER"),
    ("error_type", "VARCHAR"), ("error_message", "VARCHAR"), ("finish_reason", "VARCHAR"),
    ("prompt_tokens", "INTEGER"), ("output_tokens", "INTEGER"), ("max_tokens", "INTEGER"),
    ("context_bucket", "VARCHAR"), ("batch_bucket", "VARCHAR"),
    ("queue_s", "DOUBLE"), ("prefill_s", "DOUBLE"), ("decode_s", "DOUBLE"),
    ("sampling_s", "DOUBLE"), ("ttft_s", "DOUBLE"), ("tpot_s", "DOUBLE"), ("e2e_s", "DOUBLE"),
    ("iterations", "INTEGER"), ("avg_iter_s", "DOUBLE"), ("preemptions", "INTEGER"),
    ("slo_ttft_target_s", "DOUBLE"), ("slo_ok", "BOOLEAN"), ("policy_actions", "VARCHAR[]"),
    ("tokenize_s", "DOUBLE"),
    # The load at admission (the predictor's inputs) and the prediction made then.
    ("queue_depth", "INTEGER"), ("running_requests", "INTEGER"), ("kv_cache_usage", "DOUBLE"),
    ("recent_step_s", "DOUBLE"), ("pending_requests", "INTEGER"),
    ("pending_prefill_tokens", "BIGINT"),
    ("pending_prefill_pairs", "BIGINT"),  # their attention pairs left (the engine model's)
    ("predicted_ttft_s", "DOUBLE"), ("predicted_ttft_p90_s", "DOUBLE"),
    ("predicted_tpot_s", "DOUBLE"), ("predicted_tpot_p90_s", "DOUBLE"),
    ("predicted_e2e_s", "DOUBLE"), ("predictor_version", "VARCHAR"),
    ("vip", "BOOLEAN"),  # the API key's VIP flag (what vip_only admits; the replay needs it)
    # Who called: the API key's name, `anonymous` on a server without keys; NULL when
    # not known (no valid key). Never a peer address: a bounded set, no personal data.
    ("client", "VARCHAR"),
    # The deadline check's TTFT estimate at admission (the live engine model over the
    # work ahead in the request's lane): why a request was refused, or admitted.
    ("estimated_ttft_s", "DOUBLE"),
    # Seed 000's length-class boundaries in force at admission (`batch_bucket` is the
    # class under them); NULL for a request refused before it was tokenized.
    ("length_class_low", "INTEGER"), ("length_class_high", "INTEGER"),
    # Seconds waited in front of the engine (slot, prefill gate, a promise kept): the
    # part of queue_s that is tailguard's, the rest vLLM's queue; NULL if never admitted.
    ("admission_wait_s", "DOUBLE"),
), key=("request_id", "arrival_ts"))
SPANS: Final = TableSpec("spans", (
    ("trace_id", "VARCHAR"), ("span_id", "VARCHAR"), ("parent_span_id", "VARCHAR"),
    ("request_id", "VARCHAR"), ("name", "VARCHAR"), ("start_ts", "TIMESTAMPTZ"),
    ("end_ts", "TIMESTAMPTZ"), ("duration_s", "DOUBLE"), ("attributes", "JSON"),
), key=("trace_id", "span_id"))
ENGINE_STATS: Final = TableSpec("engine_stats", (
    ("ts", "TIMESTAMPTZ"), ("running", "INTEGER"), ("waiting", "INTEGER"),
    ("kv_cache_usage", "DOUBLE"), ("preemptions", "BIGINT"), ("prompt_tokens", "BIGINT"),
    ("generation_tokens", "BIGINT"), ("steps", "BIGINT"), ("mean_batch_size", "DOUBLE"),
    ("max_batch_size", "INTEGER"), ("mean_step_s", "DOUBLE"), ("mean_sampling_s", "DOUBLE"),
    ("finished", "BIGINT"), ("rss_bytes", "BIGINT"),
), key=("ts",))
POLICY_EVENTS: Final = TableSpec("policy_events", (
    ("ts", "TIMESTAMPTZ"), ("policy", "VARCHAR"), ("from_state", "VARCHAR"),
    ("to_state", "VARCHAR"), ("reason", "VARCHAR"), ("details", "JSON"),
), key=("ts", "policy", "to_state"))
OVERRIDES: Final = TableSpec("overrides", (
    ("policy", "VARCHAR"), ("mode", "VARCHAR"), ("reason", "VARCHAR"), ("actor", "VARCHAR"),
    ("created_ts", "TIMESTAMPTZ"), ("expires_ts", "TIMESTAMPTZ"),
), key=("policy", "created_ts"))

# The live memory forecast as served, kept so it can be drawn against what happened.
FORECASTS: Final = TableSpec("forecasts", (
    ("ts", "TIMESTAMPTZ"), ("target_ts", "TIMESTAMPTZ"), ("target", "VARCHAR"),
    ("horizon_s", "DOUBLE"), ("model", "VARCHAR"), ("value", "DOUBLE"),
), key=("ts", "target_ts", "target", "model"))

TABLES: Final[dict[str, TableSpec]] = {
    spec.name: spec for spec in (REQUESTS, SPANS, ENGINE_STATS, POLICY_EVENTS, OVERRIDES,
                                 FORECASTS)
}


def existing_columns(conn: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = ?", [table]).fetchall()
    return {name for (name,) in rows}


def create_schema(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Create missing tables and add missing columns; return the columns added.

    Idempotent: on an up-to-date file it only reads the catalog. An added column
    lands at the end of the table, so writers insert by column name, not position.
    """
    added = []
    for spec in TABLES.values():
        conn.execute(spec.create_sql())
        present = existing_columns(conn, spec.name)
        for name, sql_type in spec.columns:
            if name not in present:
                conn.execute(f"ALTER TABLE {spec.name} ADD COLUMN IF NOT EXISTS {name} {sql_type}")
                added.append(f"{spec.name}.{name}")
    return added


# --- Python values -> Arrow --------------------------------------------------------

def arrow_batches(spec: TableSpec, columns: dict[str, list], rows: int,
                  chunk_rows: int = 8192) -> Iterator[pa.RecordBatch]:
    """Convert column lists to Arrow, `chunk_rows` rows per batch, lazily.

    Each conversion holds the GIL throughout. Once the conversions have held it for
    `GIL_SLICE_S`, sleep(0) hands it to a waiting thread (the server's event loop) at
    once instead of after the 5 ms switch interval: p99 loop lag 5 ms instead of 7,
    max 11-20 ms instead of 27-35, with 50k rows/s flowing (2 noisy cores). Not after
    every column: each hand-back costs the flush a wait for the GIL (up to the switch
    interval, more when the cores are busy), and a second's 80 columns of small
    columns then took 0.5 s beside a busy loop, ten times their CPU; on a slower
    machine the writer fell seconds behind.
    """
    held_since = time.perf_counter()
    for start in range(0, rows, chunk_rows):
        arrays = []
        for (name, sql_type), arrow_field in zip(spec.columns, spec.arrow_schema):
            arrays.append(_column_array(columns[name][start:start + chunk_rows], sql_type,
                                        arrow_field.type))
            held_since = hand_gil_on(held_since)
        yield pa.RecordBatch.from_arrays(arrays, schema=spec.arrow_schema)


def hand_gil_on(held_since: float) -> float:
    """Between two pieces of GIL-holding work begun at `held_since` (perf_counter): once
    they have held it for GIL_SLICE_S, sleep(0) hands it to a waiting thread at once.
    Returns when the holding now began."""
    if time.perf_counter() - held_since < GIL_SLICE_S:
        return held_since
    time.sleep(0)
    return time.perf_counter()


def warm_up_conversion() -> None:
    """Convert one row of every table now. pyarrow's first conversion of a Python
    sequence imports pandas (0.2 s alone); a server's first flush under load did that
    beside the busy event loop, every import's file read waiting for the GIL, and took
    2.3 s: rows answered seconds before were not yet in the file."""
    for spec in TABLES.values():
        arrow_table(spec, {name: [None] for name in spec.column_names}, 1)


def arrow_table(spec: TableSpec, columns: dict[str, list], rows: int,
                chunk_rows: int = 8192) -> pa.Table:
    return pa.Table.from_batches(list(arrow_batches(spec, columns, rows, chunk_rows)),
                                 schema=spec.arrow_schema)


def _column_array(values: list, sql_type: str, arrow_type: pa.DataType) -> pa.Array:
    if sql_type == "TIMESTAMPTZ":
        return _timestamp_array(values)
    if sql_type == "JSON":  # serialized here, off the event loop
        values = [json_text(v) for v in values]
    return _safe_array(values, arrow_type)


def json_text(value: Any) -> str | None:
    """A JSON column's value as stored: a string as given, anything else serialised."""
    return value if value is None or isinstance(value, str) else _to_json(value)


def _timestamp_array(values: list) -> pa.Array:
    """Timestamps arrive as aware datetimes or epoch seconds; convert each column once."""
    # Checked up front: pyarrow would read a number among datetimes as microseconds.
    kinds = set(map(type, values)) - {type(None)}
    try:
        if kinds <= {float, int}:  # vectorised: seconds -> whole microseconds
            micros = pc.round(pc.multiply(pa.array(values, pa.float64()), 1e6))
            return micros.cast(pa.int64()).cast(_TIMESTAMP)
        if kinds <= {datetime}:
            return pa.array(values, _TIMESTAMP)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    return _safe_array([_epoch_to_datetime(v) for v in values], _TIMESTAMP)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _epoch_to_datetime(value: Any) -> Any:
    if not _is_number(value):
        return value
    try:
        return datetime.fromtimestamp(value, timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None


def _safe_array(values: list, arrow_type: pa.DataType) -> pa.Array:
    """Convert a column; if a value has the wrong type, keep the row and null that cell."""
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    kept = [v if _converts(v, arrow_type) else None for v in values]
    bad = sum(1 for v, k in zip(values, kept) if v is not None and k is None)
    log.warning("trace log: stored NULL for %d value(s) that are not %s", bad, arrow_type)
    return pa.array(kept, arrow_type)


def _converts(value: Any, arrow_type: pa.DataType) -> bool:
    try:
        pa.array([value], arrow_type)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
        return False
