"""Benchmark: `tailguard slo status` over a synthetic 10M-request trace log.

Generates the log in SQL (30 days of arrivals, mixed context lengths and outcomes),
then times the one-pass status query for every SLO, window, context bucket and
priority. Goal: < 1 s.

    python bench/slo_status.py --rows 10000000 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from observe.tracelog import TraceLog
from slo.budget import compute_status
from slo.spec import load_spec

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)

FILL = """
INSERT INTO requests (request_id, arrival_ts, status, http_status, priority, prompt_tokens,
                      context_bucket, ttft_s, tpot_s, e2e_s)
SELECT 'r' || i,
       TIMESTAMPTZ '{now}' - to_seconds(hash(i) % (30 * 86400)),
       CASE WHEN hash(i * 7) % 1000 < 3 THEN 'error'
            WHEN hash(i * 7) % 1000 < 8 THEN 'rejected' ELSE 'ok' END,
       CASE WHEN hash(i * 7) % 1000 < 3 THEN 500
            WHEN hash(i * 7) % 1000 < 8 THEN 400 ELSE 200 END,
       CASE WHEN hash(i * 3) % 10 < 3 THEN 'realtime' ELSE 'batch' END,
       ctx,
       CASE WHEN ctx <= 1024 THEN '0-1k' WHEN ctx <= 4096 THEN '1k-4k'
            WHEN ctx <= 32768 THEN '4k-32k' ELSE '32k+' END,
       0.05 + ctx / 20000.0 + (hash(i * 11) % 1000) / 4000.0,
       0.004 + (hash(i * 13) % 100) / 10000.0,
       0.5 + (hash(i * 17) % 1000) / 500.0
FROM (SELECT i, CASE WHEN hash(i * 5) % 10 < 7 THEN 200 + hash(i) % 300
                     ELSE 1024 + hash(i * 19) % 30000 END AS ctx
      FROM range({rows}) t(i))
"""


def build(path: Path, rows: int) -> float:
    TraceLog(str(path)).close()  # the real schema
    start = time.perf_counter()
    with duckdb.connect(str(path)) as conn:
        conn.execute(FILL.format(now=NOW.isoformat(), rows=rows))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    spec = load_spec()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.duckdb"
        print(f"generated {args.rows:,} rows in {build(path, args.rows):.1f} s")
        conn = duckdb.connect(str(path), read_only=True)

        def query(sql):
            cur = conn.execute(sql)
            return [d[0] for d in cur.description], cur.fetchall()

        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            status = compute_status(query, spec, NOW)
            times.append(time.perf_counter() - start)
    ttft = status.overall()[0]
    print("| rows | SLOs | windows | groups | status time median (min-max) |")
    print("|---|---|---|---|---|")
    print(f"| {args.rows:,} | {len(spec.slos)} | {len(ttft.windows)} | {len(status.slos) // len(spec.slos)}"
          f" | {statistics.median(times):.3f} s ({min(times):.3f}-{max(times):.3f}) |")
    print(f"ttft attainment {ttft.attainment:.4f}, budget remaining {ttft.budget_remaining:.3f}")


if __name__ == "__main__":
    main()
