"""How fast a rotation moves `requests` rows out of the trace log into Parquet.

Each repetition, on a fresh DuckDB file in a fresh temporary directory:
  1. fill: N finished requests (bench/serving/otlp_overhead.py's request_record: every column
     of the row the server writes, realistic values; the error columns are NULL except
     on the ~3% refused requests, as in the server) are turned into rows with
     RequestRecord.row() and written with TraceLog.add() + flush(); arrivals are spread
     evenly over the 3 days before the fill (4 UTC dates, so 4 partitions);
  2. rotate: observe.archive.Rotator(ArchiveConfig(dir, "bench", retention_s=0))
     .rotate(tracelog), timed: wall (perf_counter) and CPU (process_time: every thread
     of this process, DuckDB's and Arrow's included);
  3. check: rows moved == N, none left in the DB's `requests`, the Parquet files hold
     N rows; and size: Parquet bytes per row (all part files), DuckDB file bytes per row
     before the rotation for scale.
Rows are generated from one seed, so every repetition archives identical data.
Reported: median [min, max] over the repetitions.

    python -m bench.tracelog.archive_throughput --rows 1000000 --repeat 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow
import pyarrow.dataset as ds

from bench.common import command_line
from bench.synthetic import request_record
from observe.archive import ArchiveConfig, Rotator
from observe.schema import REQUESTS
from observe.stats import WallClock
from observe.tracelog import TraceLog

SPAN_S = 3 * 24 * 3600.0  # arrivals spread over the last 3 days
SEED = 20250101


def fill(tracelog: TraceLog, rows: int) -> float:
    """Write `rows` requests rows ending now; return the seconds it took."""
    started = time.perf_counter()
    clock, rng = WallClock(), random.Random(SEED)
    first = time.monotonic() - SPAN_S - 60  # the newest arrives a minute before now
    step = SPAN_S / rows
    add = tracelog.add
    for i in range(rows):
        rec = request_record(rng, i, first + i * step + rng.uniform(0, step))
        rec.trace_id = f"{rng.getrandbits(128):032x}"  # RequestSpans.start() sets it in the server
        add("requests", rec.row(clock))
    tracelog.flush()
    return time.perf_counter() - started


def one(rows: int, workdir: Path) -> dict:
    db, archive = workdir / "trace.duckdb", workdir / "archive"
    with TraceLog(db, flush_interval_s=3600, max_pending_rows=rows + 1) as tracelog:
        fill_s = fill(tracelog, rows)
        tracelog.with_writer(lambda conn: conn.execute("CHECKPOINT"))  # the WAL into the file
        db_bytes = db.stat().st_size
        rotator = Rotator(ArchiveConfig(archive, "bench", retention_s=0))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        moved = rotator.rotate(tracelog)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        left = tracelog.query("SELECT count(*) FROM requests").rows[0][0]
    files = sorted(archive.glob("requests/**/*.parquet"))
    in_parquet = ds.dataset(files, format="parquet").count_rows()
    ok = moved["requests"] == rows and left == 0 and in_parquet == rows
    return {"fill_s": fill_s, "wall_s": wall, "cpu_s": cpu, "rows_s": rows / wall,
            "rows_cpu_s": rows / cpu, "parquet_bpr": sum(f.stat().st_size for f in files) / rows,
            "db_bpr": db_bytes / rows, "files": len(files), "moved": moved["requests"],
            "left": left, "in_parquet": in_parquet, "ok": ok,
            "dates": sorted({f.parent.parent.name.removeprefix("date=") for f in files})}


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("command: " + command_line(__spec__.name), flush=True)
    runs = []
    for attempt in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="tailguard-archive-bench-") as tmp:
            r = one(args.rows, Path(tmp))
        runs.append(r)
        print(f"run {attempt + 1}: filled in {r['fill_s']:.1f} s; rotated {r['moved']:,} rows "
              f"in {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU into {r['files']} files "
              f"({', '.join(r['dates'])}); left in DB {r['left']}, in Parquet "
              f"{r['in_parquet']:,}: {'ok' if r['ok'] else 'MISMATCH'}", flush=True)
    print(f"\narchive rotation of {args.rows:,} `requests` rows ({len(REQUESTS.columns)} columns, "
          f"3 days), {args.repeat} runs on fresh files, duckdb {duckdb.__version__}, "
          f"pyarrow {pyarrow.__version__}; median [min, max]")
    print("\n| metric | value |\n|---|---|")
    for label, key, fmt in METRICS:
        print(f"| {label} | {spread([r[key] for r in runs], fmt)} |")
    print(f"| all rows left the DB and are in Parquet | "
          f"{'yes' if all(r['ok'] for r in runs) else 'NO'} ({sum(r['ok'] for r in runs)} of "
          f"{len(runs)} runs) |")


METRICS = (
    ("rotation wall, s", "wall_s", ".2f"),
    ("rows/s (wall)", "rows_s", ",.0f"),
    ("rotation CPU (process), s", "cpu_s", ".2f"),
    ("rows per CPU-second", "rows_cpu_s", ",.0f"),
    ("Parquet bytes per row (zstd)", "parquet_bpr", ".1f"),
    ("DuckDB file bytes per row before rotation (for scale)", "db_bpr", ".1f"),
)

if __name__ == "__main__":
    main()
