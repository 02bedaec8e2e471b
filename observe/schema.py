"""The trace-log tables, defined once.

Each table is one ordered list of (column, DuckDB type) pairs; the DDL, the column
order the writer buffers in and the Arrow schema it flushes with are all derived
from that list, so they cannot drift apart. Columns are only ever added, never
renamed or retyped: `create_schema` adds what an older file lacks, so a newer
tailguard opens an older trace log in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import duckdb
import pyarrow as pa

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


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    columns: tuple[tuple[str, str], ...]  # (column name, DuckDB type), in file order
    column_names: tuple[str, ...] = field(init=False)
    arrow_schema: pa.Schema = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(name for name, _ in self.columns)
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
))
SPANS: Final = TableSpec("spans", (
    ("trace_id", "VARCHAR"), ("span_id", "VARCHAR"), ("parent_span_id", "VARCHAR"),
    ("request_id", "VARCHAR"), ("name", "VARCHAR"), ("start_ts", "TIMESTAMPTZ"),
    ("end_ts", "TIMESTAMPTZ"), ("duration_s", "DOUBLE"), ("attributes", "JSON"),
))
ENGINE_STATS: Final = TableSpec("engine_stats", (
    ("ts", "TIMESTAMPTZ"), ("running", "INTEGER"), ("waiting", "INTEGER"),
    ("kv_cache_usage", "DOUBLE"), ("preemptions", "BIGINT"), ("prompt_tokens", "BIGINT"),
    ("generation_tokens", "BIGINT"), ("steps", "BIGINT"), ("mean_batch_size", "DOUBLE"),
    ("max_batch_size", "INTEGER"), ("mean_step_s", "DOUBLE"), ("mean_sampling_s", "DOUBLE"),
    ("finished", "BIGINT"),
))
POLICY_EVENTS: Final = TableSpec("policy_events", (
    ("ts", "TIMESTAMPTZ"), ("policy", "VARCHAR"), ("from_state", "VARCHAR"),
    ("to_state", "VARCHAR"), ("reason", "VARCHAR"), ("details", "JSON"),
))
OVERRIDES: Final = TableSpec("overrides", (
    ("policy", "VARCHAR"), ("mode", "VARCHAR"), ("reason", "VARCHAR"), ("actor", "VARCHAR"),
    ("created_ts", "TIMESTAMPTZ"), ("expires_ts", "TIMESTAMPTZ"),
))

TABLES: Final[dict[str, TableSpec]] = {
    spec.name: spec for spec in (REQUESTS, SPANS, ENGINE_STATS, POLICY_EVENTS, OVERRIDES)
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
