"""Benchmark: the trace log's example queries (docs/trace-log.md) over 10M requests.

Builds (or reuses with --keep) a synthetic 30-day, 10M-row trace log in SQL, then
times each example query read-only, best and median of --repeat runs.

    python -m bench.tracelog.query --rows 10000000 --repeat 5
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from bench.common import REPO_ROOT
from bench.tracelog.slo_status import build
from observe.query import query_file

DOC = REPO_ROOT / "docs" / "trace-log.md"


def example_queries(now: datetime) -> list[tuple[str, str]]:
    """(title, sql) pairs: each ```sql block with the sentence before it."""
    text = DOC.read_text()
    # the title is the whole paragraph before the block (it may wrap over lines)
    pairs = re.findall(r"\n\n((?:[^\n`]+\n)*?[^\n`]+):\n\n```sql\n(.*?)```", text, re.S)
    # `now()` in the docs means "now": the newest arrival of the synthetic log.
    return [(" ".join(title.split()), sql.replace("now()", f"TIMESTAMPTZ '{now.isoformat()}'"))
            for title, sql in pairs]


def newest_arrival(path: Path) -> datetime:
    with duckdb.connect(str(path), read_only=True) as conn:
        return conn.execute("SELECT max(arrival_ts) FROM requests").fetchone()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="build here once and reuse")
    args = ap.parse_args()
    path = args.keep or Path("/tmp/tailguard-bench-10m.duckdb")
    if not path.exists():
        took = build(path, args.rows, datetime.now(timezone.utc))
        print(f"generated {args.rows:,} rows in {took:.1f} s")
    print(f"\n| query ({args.rows:,} rows) | best | median |\n|---|---|---|")
    for title, sql in example_queries(newest_arrival(path)):
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            query_file(path, sql, timeout_s=120)
            times.append(time.perf_counter() - start)
        print(f"| {title} | {min(times):.3f} s | {statistics.median(times):.3f} s |")
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()
