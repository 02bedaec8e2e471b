"""How long the trace writer's flush of one second's rows takes while another thread
keeps the GIL busy, as a saturated server's event loop does.

Each flush gives the GIL up many times (every DuckDB call, each hand-back during the
Arrow conversion) and waits to get it back, up to the interpreter's switch interval
each time, so beside a busy loop its wall time is mostly waiting. What a flush takes
bounds how far behind the file runs: a row is in the file at most one flush interval
plus one flush after its request ended, and a kill loses no more.

Variants, alternated round by round (order reversed every other round):
  per-column  hand the GIL back after every column's conversion (before 9a7add4),
              Python's default 5 ms switch interval
  sliced      hand it back after GIL_SLICE_S held (observe/schema.py), 5 ms
  sliced-1ms  as sliced, with a 1 ms switch interval (not adopted: it cost the server
              13% more CPU per request and 12% of its tokens/s at saturation)
Each run: a fresh DuckDB file, the writer at its default 1 s interval, `--rate`
requests a second (a `requests` row and `--spans` span rows each) added for
`--seconds`; reported: the flushes' wall time (median, max) and the CPU time the
writer's thread used per flush (from /proc), which the waiting does not inflate.

    python -m bench.tracelog.flush_beside_loop --rounds 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from bench.common import command_line
from bench.tracelog.ingest import START, request_row
from observe import schema
from observe.tracelog import TraceLog

VARIANTS = {  # name: (GIL slice s, switch interval s)
    "per-column": (0.0, 0.005),
    "sliced": (schema.GIL_SLICE_S, 0.005),
    "sliced-1ms": (schema.GIL_SLICE_S, 0.001),
}
TICK_S = 0.05  # rows are added in bursts this far apart


def span_row(i: int, rng: random.Random) -> dict:
    start = START + timedelta(microseconds=i * 131)
    duration = rng.expovariate(100)
    return {"trace_id": f"{rng.getrandbits(128):032x}", "span_id": f"{rng.getrandbits(64):016x}",
            "parent_span_id": f"{rng.getrandbits(64):016x}", "request_id": f"cmpl-{i // 9:012x}",
            "name": rng.choice(("llm.queue", "llm.prefill", "llm.decode", "llm.step")),
            "start_ts": start, "end_ts": start + timedelta(seconds=duration),
            "duration_s": duration,
            "attributes": {"tailguard.step.scheduled_tokens": rng.randrange(1, 2048),
                           "gen_ai.request.model": "tiny-llama"}}


def busy(stop: threading.Event) -> None:
    """Pure Python, never sleeping: the GIL is always wanted here."""
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i


def thread_cpu_s(native_id: int) -> float:
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks


def run(variant: str, args, workdir: Path) -> dict:
    slice_s, switch_s = VARIANTS[variant]
    schema.GIL_SLICE_S, old_switch = slice_s, sys.getswitchinterval()
    sys.setswitchinterval(switch_s)
    rng, stop = random.Random(args.seed), threading.Event()
    requests = [request_row(i, rng) for i in range(args.rate * args.seconds)]
    spans = [span_row(i, rng) for i in range(len(requests) * args.spans)]
    spinner = threading.Thread(target=busy, args=(stop,), daemon=True)
    log = TraceLog(workdir / f"{variant}-{time.monotonic_ns()}.duckdb", flush_interval_s=1.0)
    spinner.start()
    try:
        walls, cpu_before, seen = [], thread_cpu_s(log._thread.native_id), 0
        per_tick = max(1, round(args.rate * TICK_S))
        for tick in range(round(args.seconds / TICK_S)):
            for i in range(tick * per_tick, (tick + 1) * per_tick):
                log.add("requests", requests[i % len(requests)])
                for k in range(args.spans):
                    log.add("spans", spans[(i * args.spans + k) % len(spans)])
            time.sleep(TICK_S)
            stats = log.stats()
            if stats["flushes"] != seen:
                seen = stats["flushes"]
                walls.append(stats["last_flush_s"])
        cpu = thread_cpu_s(log._thread.native_id) - cpu_before
    finally:
        stop.set()
        spinner.join()
        log.close()
        schema.GIL_SLICE_S = VARIANTS["sliced"][0]
        sys.setswitchinterval(old_switch)
    return {"flushes": len(walls), "median_ms": statistics.median(walls) * 1e3,
            "max_ms": max(walls) * 1e3, "cpu_ms": cpu / max(1, len(walls)) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=int, default=100, help="requests a second")
    ap.add_argument("--spans", type=int, default=9, help="span rows per request")
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(command_line("bench.tracelog.flush_beside_loop"))
    schema.warm_up_conversion()
    names, results = list(VARIANTS), {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                out = run(name, args, Path(tmp))
                results[name].append(out)
                print(f"round {r + 1} {name:10s} flushes {out['flushes']:2d}  wall median "
                      f"{out['median_ms']:6.1f} ms  max {out['max_ms']:6.1f} ms  "
                      f"writer CPU {out['cpu_ms']:5.1f} ms/flush", flush=True)
    print("\nvariant     wall median ms, median [min-max] of rounds   max ms   CPU ms/flush")
    for name, outs in results.items():
        med = [o["median_ms"] for o in outs]
        print(f"{name:10s}  {statistics.median(med):6.1f} [{min(med):.1f}-{max(med):.1f}]"
              f"{'':22s}{max(o['max_ms'] for o in outs):6.1f}   "
              f"{statistics.median(o['cpu_ms'] for o in outs):5.1f}")


if __name__ == "__main__":
    main()
