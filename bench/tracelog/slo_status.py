"""Benchmark: `tailguard slo status` over a synthetic 10M-request trace log.

Generates the log in SQL (30 days of arrivals before now, mixed context lengths and
outcomes), then times the product's own query path: the `tailguard slo status --db
FILE --groups --format json` command, run in this process (no interpreter start-up),
which opens the file read-only through `observe.query.query_file` (the SQL gate, its
row and time limits) and computes every SLO, window, context bucket and priority with
`slo.budget.compute_status`, the code `GET /admin/slo` runs too. Goal: < 1 s.

    python -m bench.tracelog.slo_status --rows 10000000 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
from click.testing import CliRunner

from observe.tracelog import TraceLog
from slo.loading import load_spec
from tailguard.cli import main as tailguard

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


def build(path: Path, rows: int, now: datetime) -> float:
    """The real schema, filled with `rows` requests from the 30 days before `now`."""
    TraceLog(str(path)).close()
    start = time.perf_counter()
    with duckdb.connect(str(path)) as conn:
        conn.execute(FILL.format(now=now.isoformat(), rows=rows))
    return time.perf_counter() - start


def slo_status(path: Path) -> dict:
    """What `tailguard slo status --db PATH --groups --format json` prints, parsed."""
    result = CliRunner().invoke(tailguard, ["slo", "status", "--db", str(path), "--groups",
                                            "--format", "json"])
    if result.exit_code != 0:
        raise RuntimeError(f"tailguard slo status failed: {result.output}") from result.exception
    return json.loads(result.output)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    spec = load_spec()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.duckdb"
        took = build(path, args.rows, datetime.now(timezone.utc))
        print(f"generated {args.rows:,} rows in {took:.1f} s")
        times = []
        for i in range(args.repeat):
            start = time.perf_counter()
            status = slo_status(path)
            times.append(time.perf_counter() - start)
            print(f"run {i}: {times[-1]:.3f} s", flush=True)
    overall = [s for s in status["slos"] if not s["group"]]
    ttft = overall[0]
    print("| rows | SLOs | windows | groups | status time median (min-max) |")
    print("|---|---|---|---|---|")
    print(f"| {args.rows:,} | {len(spec.slos)} | {len(ttft['windows'])} "
          f"| {len(status['slos']) // len(spec.slos)} | {statistics.median(times):.3f} s "
          f"({min(times):.3f}-{max(times):.3f}) |")
    print(f"{ttft['name']} attainment {ttft['attainment']:.4f}, "
          f"budget remaining {ttft['budget_remaining']:.3f}")


if __name__ == "__main__":
    main()
