"""Benchmark: the trace-log writer's CPU per second of rows in two checkouts, at a
light server's pace and a saturated one's (issue 20: the spool).

Each side runs in a child process of its checkout (`PYTHONPATH`): a real `TraceLog` on
a file with its default intervals, fed for `--seconds` with the rows a server makes
(at light load about one request a second: one `requests` row, 8 `spans` rows and the
engine's second; saturated on this machine 44 requests, 330 span rows and the
engine's second), added in ten slices a second as a server adds them, after 3 s of
the same not measured (the first conversions and statements), then closed.
It reports the CPU of the writer's threads (`tailguard-tracelog*`) while fed, and of
the whole process but the feeding thread until the log is closed (DuckDB's own
threads and the close's last load count), in ms per second of rows. Sides alternate,
order reversed every other round; every round is printed, then the medians, and B/A
per round.

    git worktree add /tmp/base REV
    python -m bench.tracelog.spool_cost /tmp/base . --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PACES = {"light": {"requests": 1, "spans": 8, "engine_stats": 1},
         "saturated": {"requests": 44, "spans": 330, "engine_stats": 1}}

CHILD = r"""
import json, os, sys, tempfile, threading, time
from bench.tracelog.statement_cost import synthetic_rows
from observe.tracelog import TraceLog

pace, seconds = json.loads(sys.argv[1]), float(sys.argv[2])
rows = {t: synthetic_rows(t, n) for t, n in pace.items()}

def feed(log, seconds):
    # `pace` rows a second, in ten slices a second
    start, added = time.monotonic(), dict.fromkeys(pace, 0)
    for tick in range(int(seconds * 10)):
        for table, per_second in pace.items():
            due = per_second * (tick + 1) // 10 - added[table]
            for i in range(added[table], added[table] + due):
                log.add(table, {name: values[i % len(values)]
                                for name, values in rows[table].items()})
            added[table] += due
        time.sleep(max(0.0, start + (tick + 1) / 10 - time.monotonic()))

log = TraceLog(os.path.join(tempfile.mkdtemp(), "trace.duckdb"))
# The writer's threads: the flushing one, and since f85a282 the loading one beside it.
clocks = [time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
          if t.name.startswith("tailguard-tracelog")]
writer_cpu = lambda: sum(map(time.clock_gettime, clocks))
feed(log, 3.0)  # first conversions and statements: a start-up cost, not a second's
w0, p0, f0 = writer_cpu(), time.process_time(), time.thread_time()
feed(log, seconds)
w1, f1 = writer_cpu(), time.thread_time()
log.close()  # its last load counts: the spool's deferred work is not left out
p1 = time.process_time()
print(json.dumps({"writer_ms_s": (w1 - w0) / seconds * 1e3,
                  "process_ms_s": ((p1 - p0) - (f1 - f0)) / seconds * 1e3}))
"""


def run_side(checkout: Path, pace: dict, seconds: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(pace), str(seconds)],
                          cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=seconds + 120)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    sides = {"A": args.a.resolve(), "B": args.b.resolve()}
    results = {(pace, side): [] for pace in PACES for side in sides}
    for rnd in range(args.rounds):
        order = ("A", "B") if rnd % 2 == 0 else ("B", "A")
        for pace_name, pace in PACES.items():
            for side in order:
                results[pace_name, side].append(run_side(sides[side], pace, args.seconds))
            a, b = results[pace_name, "A"][-1], results[pace_name, "B"][-1]
            print(f"round {rnd + 1} ({order[0]} first) {pace_name}: writer ms/s A "
                  f"{a['writer_ms_s']:.2f} B {b['writer_ms_s']:.2f}; process ms/s A "
                  f"{a['process_ms_s']:.2f} B {b['process_ms_s']:.2f}", flush=True)
    for pace_name in PACES:
        for key in ("writer_ms_s", "process_ms_s"):
            a = [r[key] for r in results[pace_name, "A"]]
            b = [r[key] for r in results[pace_name, "B"]]
            ratios = [y / x for x, y in zip(a, b) if x > 0]
            print(f"{pace_name} {key}: A median {statistics.median(a):.2f} "
                  f"[{min(a):.2f}-{max(a):.2f}], B median {statistics.median(b):.2f} "
                  f"[{min(b):.2f}-{max(b):.2f}], B/A per round median "
                  f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
