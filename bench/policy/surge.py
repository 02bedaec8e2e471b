"""Benchmark: degradation policies on vs off under a 3x surge, and breaker recovery.

One tailguard server on the embedded model (48 MiB KV cache, a keys file with
realtime, VIP and batch clients). Each round runs the `surge` workload (mixed
context lengths, 3x rate through the middle third) once per side, policies off (every
policy forced off, batch control too) and on (all auto); the side that runs first
alternates (even rounds off first, odd rounds on first), so neither side always meets
the warmer or the noisier machine. Every run is printed as it ends, then a table of
every round, the per-round on/off ratios, their median and spread (min-max), and the
goal's verdict. Traffic: 60% realtime, 10% VIP, 30% batch keys.

Figures per run (the scoring functions in `surge_scoring` are pure and unit-tested):
- goodput: requests served with their first token within the context-aware TTFT
  target (client clock), per second of the run;
- smooth goodput: the same sum, but each request earns `credit`: 0 when shed, refused
  or failed, 0 when it missed its target, otherwise the share of what its user asked
  for that they got: (output tokens received / max_tokens asked) x (prompt tokens kept
  / prompt tokens sent), capped at 1. A request served untouched and on time earns 1;
  one whose max_tokens was capped from 64 to 16 earns 0.25. Shedding or cutting work
  therefore lowers the figure by what the users lost, and cannot raise it. (Plain
  goodput counts a capped request as 1, and goodput per *served* request rewards
  shedding everything but the easy ones.) The client cannot see a truncated prompt, so
  the bench counts the server's `truncate:` actions per run; `smooth_exact` is false
  when there were any (the surge workload's prompts fit under the truncation limit);
- realtime-key attainment: the share of every request sent with a realtime or VIP key
  that met its target (shed ones miss);
- realtime-lane attainment (server's trace log): of the requests that entered the
  realtime lane (logged with priority realtime, or demoted from it, and not refused
  before admission), the share served on time *and never demoted*: a request moved
  out of the lane (`demote:` in its policy actions) is a miss of the lane, however
  fast the batch lane then served it.
Goal: smooth goodput with policies on >= 1.5x off (median of the per-round ratios).

Then a breaker drill: steady load, an injected slow engine long enough to trip
breaker L1, the fault cleared, and the SLO attainment of the requests that *arrive*
after the clear against those that arrived before the fault. (Throughput after the
clear would count the backlog of the fault draining as recovery.)

    python -m bench.policy.surge --rounds 5 --rate 4 --duration 150 \
        --latency-model traces/diurnal.duckdb.models/latency.pkl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.policy.surge_drill import DRILL_WINDOWS, RECOVERED_SHARE, breaker_drill
from bench.policy.surge_scoring import report, server_view, summarize
from bench.policy.surge_server import drive, server_rows, set_policies, start

SIDES = (("off", "force_off"), ("on", "auto"))


def side_order(rnd: int) -> tuple:
    """Even rounds run policies off first, odd rounds on first."""
    return SIDES if rnd % 2 == 0 else SIDES[::-1]


def surge_rounds(url: str, rounds: int, rate: float, duration: float) -> list[dict]:
    out = []
    for rnd in range(rounds):
        for order, (side, mode) in enumerate(side_order(rnd)):
            set_policies(url, mode)
            time.sleep(5)
            start = time.time()
            by_key = asyncio.run(drive(url, "surge", rate, duration, rnd))
            row = {"round": rnd, "side": side, "order": order, **summarize(by_key, duration),
                   **server_view(server_rows(url, start, time.time()))}
            print(json.dumps(row), flush=True)
            out.append(row)
    set_policies(url, "auto")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="on/off pairs, order alternating")
    ap.add_argument("--rate", type=float, default=2.5, help="base requests/s (surge 3x)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--drill-rate", type=float, default=2.0)
    ap.add_argument("--fault-s", type=float, default=45.0)
    ap.add_argument("--port", type=int, default=8133)
    ap.add_argument("--no-drill", action="store_true", help="the surge rounds only")
    ap.add_argument("--latency-model", help="a trained latency model (tailguard predict "
                    "train) for the predicted-miss policy; default: the seed formula")
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = start(Path(tmp), args.port, args.latency_model)
        try:
            rows = surge_rounds(url, args.rounds, args.rate, args.duration)
            drill = None if args.no_drill else breaker_drill(url, args.drill_rate,
                                                             args.fault_s)
        finally:
            server.terminate()
            server.wait(timeout=120)
    if rows:
        report(rows)
    if drill is None:
        return
    print("breaker drill:", json.dumps(drill))
    if not drill["met"]:
        sys.exit(f"breaker drill: attainment of requests arriving "
                 f"{DRILL_WINDOWS[-1][0]}-{DRILL_WINDOWS[-1][1]} s after the clear is "
                 f"below {RECOVERED_SHARE:.0%} of the baseline's")


if __name__ == "__main__":
    main()
