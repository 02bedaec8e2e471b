"""Setting up the trace log (observe/tracelog/writer.py): its configuration, resolved
argument -> environment variable -> default and checked on construction, and its
DuckDB file opened for writing, with the INSERT that each batch runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import duckdb

from observe import settings
from observe.schema import TableSpec, create_schema
from observe.settings import TAILGUARD_TRACE_FLUSH_S, TAILGUARD_TRACE_MEMORY

DEFAULT_FLUSH_INTERVAL_S: Final = 1.0
# Spooled rows go into DuckDB once every this many flushes (and before any read). An
# INSERT's fixed cost (2-5 ms a table) every ten seconds was about a quarter of a light
# server's CPU beyond vLLM's own server (docs/benchmarks.md, "The trace-log load once a
# minute"); the spool keeps the rows durable meanwhile, and a reader loads them first.
LOAD_FLUSHES: Final = 60
# ...or sooner, once this many rows wait for it: a busy server's minute stays a bounded
# load (and memory), well under `max_buffer_rows`, past which a flush skips the spool.
LOAD_ROWS: Final = 20_000
# DuckDB's default memory limit is 80% of RAM, and its buffer cache keeps the blocks
# of a growing file: the server's RSS grew with the trace log (+25 MiB in a 10-minute
# soak, without end). Cached blocks above the limit are evicted; big queries spill.
DEFAULT_MEMORY_LIMIT: Final = "512MB"
_MEMORY_LIMIT = re.compile(r"\d+(\.\d+)?\s*(B|[KMGT]i?B)", re.IGNORECASE)
# The Arrow stream a batch is inserted from, registered under this name meanwhile.
BATCH_VIEW: Final = "__tailguard_batch"


@dataclass(slots=True)
class TraceLogConfig:
    flush_interval_s: float | None = None  # None: $TAILGUARD_TRACE_FLUSH_S, else 1.0
    max_buffer_rows: int = 50_000  # one table's buffer this full wakes the flusher
    max_pending_rows: int = 1_000_000  # this many not in DuckDB yet: new rows are dropped
    memory_limit: str | None = None  # None: $TAILGUARD_TRACE_MEMORY, else 512MB
    load_interval_s: float | None = None  # None: LOAD_FLUSHES flush intervals

    def __post_init__(self) -> None:
        if self.memory_limit is None:
            self.memory_limit = settings.get(TAILGUARD_TRACE_MEMORY, DEFAULT_MEMORY_LIMIT)
        self.memory_limit = self.memory_limit.strip()
        if not _MEMORY_LIMIT.fullmatch(self.memory_limit):
            raise ValueError(f"trace-log memory limit must look like 512MB or 2GiB, "
                             f"got {self.memory_limit!r}")
        if self.flush_interval_s is None:  # set but empty is a mistake here, not unset
            self.flush_interval_s = settings.number(
                TAILGUARD_TRACE_FLUSH_S, DEFAULT_FLUSH_INTERVAL_S,
                complaint="{name} must be a number, got {raw!r}", blank_is_unset=False)
        if self.load_interval_s is None:
            self.load_interval_s = LOAD_FLUSHES * self.flush_interval_s
        for name in ("flush_interval_s", "max_buffer_rows", "max_pending_rows",
                     "load_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


def open_writer(path: str, memory_limit: str) -> duckdb.DuckDBPyConnection:
    """The writer's connection: the schema created or migrated, and locked down."""
    conn = duckdb.connect(path, config={"memory_limit": memory_limit})
    create_schema(conn)
    # Every query session computes dates in UTC, whatever the server's local zone.
    conn.execute("SET GLOBAL TimeZone = 'UTC'")
    conn.execute("SET enable_external_access = false")  # SQL cannot read files or URLs
    conn.execute("SET lock_configuration = true")  # ... nor switch it back on
    return conn


def insert_sql(spec: TableSpec) -> str:
    """INSERT by name (a migrated file has added columns at the end, not in our order)."""
    json_columns = spec.columns_of_type("JSON")
    # Invalid JSON text is stored as a JSON string rather than failing the batch.
    select = [f"CASE WHEN json_valid({c}) THEN {c}::JSON ELSE to_json({c}) END"
              if c in json_columns else c for c in spec.column_names]
    return (f"INSERT INTO {spec.name} ({', '.join(spec.column_names)}) "
            f"SELECT {', '.join(select)} FROM {BATCH_VIEW}")
