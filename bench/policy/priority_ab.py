"""Benchmark: vLLM's priority scheduling against its default first-come order, both
behind tailguard's policies (all automatic).

Issue 19 asks whether the engine's own ordering does better than the concurrency
limiter's lanes alone: with `--scheduling-policy priority` the lanes become engine
priorities (VIP 0, realtime 1, batch 2; vLLM schedules smaller first and preempts
running lower-priority requests when it must). Two servers on the same engine flags
(one per scheduling policy) run side by side; each round drives the same `surge`
workload through each, the order alternating (A-B, B-A, ...), one server loaded at a
time. Printed: every run as a JSON line, then the table, the per-round B/A ratios of
goodput with their median and spread, and the admitted realtime and VIP attainment.

    python -m bench.policy.priority_ab --rounds 3 --rate 0.6 --factor 5 \\
        --engine-arg=--dtype --engine-arg=float32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.policy.surge_scoring import server_view, summarize
from bench.policy.surge_server import drive, server_rows, set_policies, start

SIDES = ("fcfs", "priority")


def one_run(url: str, rate: float, duration: float, factor: float, seed: int) -> dict:
    time.sleep(5)
    began = time.time()
    by_key = asyncio.run(drive(url, "surge", rate, duration, seed, factor))
    return {**summarize(by_key, duration), **server_view(server_rows(url, began, time.time()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=0.6)
    ap.add_argument("--factor", type=float, default=5.0)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=200)
    ap.add_argument("--port", type=int, default=8140)
    ap.add_argument("--engine-arg", action="append", default=[])
    args = ap.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        servers, urls = [], {}
        try:
            for i, side in enumerate(SIDES):
                extra = ["--scheduling-policy", side] if side == "priority" else []
                path = Path(tmp) / side
                path.mkdir()
                servers.append(start(path, args.port + i, None,
                                     (*args.engine_arg, *extra)))
                urls[side] = f"http://127.0.0.1:{args.port + i}"
                set_policies(urls[side], "auto")
            for rnd in range(args.rounds):
                order = SIDES if rnd % 2 == 0 else SIDES[::-1]
                for side in order:
                    row = {"round": rnd, "side": side, "first": side == order[0],
                           **one_run(urls[side], args.rate, args.duration, args.factor,
                                     args.seed + rnd)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=120)
    report(rows)


def report(rows: list[dict]) -> None:
    print("| round | scheduling | first? | offered | served on time/s | refused "
          "| admitted realtime att. | VIP att. |")
    print("|" + "---|" * 8)
    for r in rows:
        print(f"| {r['round']} | {r['side']} | {'yes' if r['first'] else 'no'} "
              f"| {r['offered']} | {r['goodput_rps']:.2f} | {r['shed']} "
              f"| {_pct(r['admitted_realtime_attainment'])} | {_pct(r['vip_attainment'])} |")
    by_round: dict = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["side"]] = r["goodput_rps"]
    ratios = [v["priority"] / v["fcfs"] for v in by_round.values()
              if v.get("fcfs") and "priority" in v]
    if ratios:
        print(f"goodput priority/fcfs per round: {[round(x, 2) for x in ratios]}, median "
              f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max "
              f"{max(ratios):.2f})")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


if __name__ == "__main__":
    main()
