"""Benchmark: what the trace-log writer's CPU per second of a saturated server's rows is
made of, and what two ways of cutting it would save (issue 20).

A saturated server here finishes about 44 requests a second: one `requests` row each
and about 330 `spans` rows a second (phases and engine steps). Each variant writes
40 seconds' worth of such rows into a trace-log file with the writer's own code
(`observe.schema.arrow_batches`, the INSERT of `observe.tracelog.setup.insert_sql`) and
reports the calling thread's CPU per second of rows:
- `now`: one INSERT per table a second, each its own transaction (what the writer does);
- `one_transaction`: the same INSERTs inside one BEGIN ... COMMIT a second;
- `every_2s`: one INSERT per table every two seconds (twice the rows each);
- `convert_only`: the Arrow conversion alone, no INSERT.
Variants alternate, order reversed every other round; every round is printed, then the
median and range.

    python -m bench.tracelog.statement_cost --rounds 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

import pyarrow as pa

from observe.schema import TABLES, arrow_batches
from observe.tracelog.setup import BATCH_VIEW, insert_sql, open_writer

PER_SECOND = {"requests": 44, "spans": 330}
SECONDS = 40
VARIANTS = ("now", "one_transaction", "every_2s", "convert_only")


def synthetic_rows(table: str, n: int) -> dict[str, list]:
    """`n` rows of plausible values for every column of `table`."""
    spec = TABLES[table]
    columns: dict[str, list] = {name: [] for name in spec.column_names}
    now = time.time()
    for i in range(n):
        for name in spec.column_names:
            kind = spec.arrow_schema.field(name).type
            if name in spec.columns_of_type("JSON"):
                value = {"gen_ai.request.model": "tiny", "index": i}
            elif pa.types.is_timestamp(kind):
                value = now + i * 1e-3
            elif pa.types.is_floating(kind):
                value = random.random()
            elif pa.types.is_integer(kind):
                value = i
            elif pa.types.is_boolean(kind):
                value = i % 2 == 0
            elif pa.types.is_list(kind):
                value = ["admit"]
            else:
                value = f"{name}-{i}"
            columns[name].append(value)
    return columns


def insert(conn, table: str, columns: dict[str, list], rows: int) -> None:
    spec = TABLES[table]
    stream = pa.RecordBatchReader.from_batches(
        spec.arrow_schema, arrow_batches(spec, columns, rows, 8192))
    conn.register(BATCH_VIEW, stream)
    try:
        conn.execute(insert_sql(spec))
    finally:
        conn.unregister(BATCH_VIEW)


def run(variant: str, conn) -> float:
    """CPU ms of this thread per second of rows."""
    every = 2 if variant == "every_2s" else 1
    batches = {t: (synthetic_rows(t, n * every), n * every) for t, n in PER_SECOND.items()}
    started = time.thread_time()
    for _ in range(SECONDS // every):
        if variant == "convert_only":
            for table, (columns, rows) in batches.items():
                list(arrow_batches(TABLES[table], columns, rows, 8192))
            continue
        if variant == "one_transaction":
            conn.execute("BEGIN TRANSACTION")
        for table, (columns, rows) in batches.items():
            insert(conn, table, columns, rows)
        if variant == "one_transaction":
            conn.execute("COMMIT")
    return (time.thread_time() - started) / SECONDS * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    conn = open_writer(os.path.join(tempfile.mkdtemp(), "trace.duckdb"), "512MB")
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rnd in range(args.rounds):
        for variant in VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]:
            results[variant].append(run(variant, conn))
        print(f"round {rnd + 1}: " + ", ".join(f"{v} {results[v][-1]:.2f}" for v in VARIANTS),
              flush=True)
    print("CPU ms per second of rows, median [min-max]:")
    for variant, values in results.items():
        print(f"  {variant}: {statistics.median(values):.2f} "
              f"[{min(values):.2f}-{max(values):.2f}]")


if __name__ == "__main__":
    main()
