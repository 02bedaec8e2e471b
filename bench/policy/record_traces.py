"""Record a trace log to train and judge the latency predictor and memory forecaster.

Starts a tailguard server on the embedded model with its own trace file, drives it
with one or more open-loop workloads (default: the compressed-day `diurnal` scenario:
chat and documents up to the context, bursts, ramps), then stops it. The KV cache is
made small on purpose (48 MiB, about 24k tokens) so that long documents under load
really fill it, as a production GPU's does; with vLLM's CPU default of 1 GiB the
embedded model could never use more than a few percent.

    python -m bench.policy.record_traces --db traces/diurnal.duckdb --rate 6 --duration 2400
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from pathlib import Path

from bench.common import start_tailguard
from loadgen.runner import Target, discover, run
from loadgen.workload import SCENARIOS, Workload

KV_CACHE_BYTES = 48 * 1024 * 1024


def start_server(db: Path, port: int, kv_bytes: int) -> subprocess.Popen:
    serve = ["--db", str(db), "--retrain-interval", "0",
             "--", "--kv-cache-memory-bytes", str(kv_bytes)]
    return start_tailguard(port, serve, db.with_suffix(".server.log"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--scenario", choices=SCENARIOS, default="diurnal")
    ap.add_argument("--rate", type=float, default=6.0, help="peak requests/s")
    ap.add_argument("--duration", type=float, default=2400.0)
    ap.add_argument("--period", type=float, default=600.0, help="diurnal: one day, s")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--kv-cache-bytes", type=int, default=KV_CACHE_BYTES)
    args = ap.parse_args()
    args.db.parent.mkdir(parents=True, exist_ok=True)
    server = start_server(args.db, args.port, args.kv_cache_bytes)
    try:
        url = f"http://127.0.0.1:{args.port}"
        model, context = discover(url)
        workload = Workload(args.scenario, args.rate, args.duration, 1_000_000,
                            max_context=context, output_tokens=args.output_tokens,
                            seed=args.seed, period_s=args.period)
        started = time.monotonic()
        results = asyncio.run(run(Target(url, model, timeout_s=300, drain_s=120), workload))
        ok = sum(r.status == "ok" for r in results)
        print(f"{args.scenario}: {len(results)} requests, {ok} ok, "
              f"{time.monotonic() - started:.0f} s -> {args.db}")
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()
