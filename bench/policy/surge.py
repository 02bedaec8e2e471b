"""Benchmark: degradation policies on vs off under 3x, 5x and 10x surges, and breaker
recovery.

One tailguard server on the embedded model (48 MiB KV cache, a keys file with
realtime, VIP and batch clients). Each round runs the `surge` workload (mixed
context lengths, the surge factor x the base rate through the middle third) once per
side, policies off (every
policy forced off, batch control too) and on (all auto); the side that runs first
alternates (even rounds off first, odd rounds on first), so neither side always meets
the warmer or the noisier machine. Every run is printed as it ends, then a table of
every round, the per-round on/off ratios, their median and spread (min-max), and the
goal's verdict. Traffic: 60% realtime, 10% VIP, 30% batch keys.

Figures per run (the scoring functions in `surge_scoring` are pure and unit-tested):
- base busy: the share of the base phase (the first third, before the surge) the
  engine spent stepping; near 100% the base rate is already at this machine's
  capacity and the run cannot show what a policy wins (choose a lower `--rate`);
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
- admitted realtime attainment (server's trace log): of the non-VIP requests admitted
  to the realtime lane (logged with priority realtime, or demoted from it, and not
  refused before admission), the share served on time *and never demoted*; those
  the deadline check served best effort at once (late even on an idle engine: the
  target is under what this engine can do for the prompt's length) are counted apart
  in `best effort`, not as admitted; VIP
  attainment: of every VIP request, the share on time (a refused VIP is a miss);
- retries: a request refused with 429 is sent once more after its Retry-After; the
  share of those retries served on time (the original request stays a 0 in goodput);
- miss precision / recall (policies-off runs, where the deadline check refuses
  nobody but still estimates): of the requests it would have refused (estimate above
  the server's `deadline_margin` x target), the share that did miss, and of those
  that missed, the share it would have refused.
Goal (issue 19): goodput with policies on >= 1.5x off in every round at 5x and 10x,
>= 1.2x at 3x.

Then a breaker drill: steady load, an injected slow engine long enough to trip
breaker L1, the fault cleared, and the SLO attainment of the requests that *arrive*
after the clear against those that arrived before the fault. (Throughput after the
clear would count the backlog of the fault draining as recovery.)

    python -m bench.policy.surge --rounds 3 --rate 0.6 --factors 3,5,10 --duration 60 \
        --engine-arg=--dtype --engine-arg=float32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine
from bench.policy.surge_drill import DRILL_WINDOWS, RECOVERED_SHARE, breaker_drill
from bench.policy.surge_scoring import report, server_view, summarize
from bench.policy.surge_server import (
    admin,
    drive,
    engine_busy,
    server_rows,
    set_policies,
    start,
)

SIDES = (("off", "force_off"), ("on", "auto"))


def side_order(rnd: int, only: str | None = None) -> tuple:
    """Even rounds run policies off first, odd rounds on first; `only` one side (a
    recording under one config, for `tailguard replay` to be judged on)."""
    if only:
        return tuple(s for s in SIDES if s[0] == only)
    return SIDES if rnd % 2 == 0 else SIDES[::-1]


def surge_rounds(url: str, rounds: int, rate: float, duration: float, factor: float = 3.0,
                 seed: int = 0, only: str | None = None) -> list[dict]:
    out = []
    # the margin the server's deadline check refuses with (its default, or --policies')
    margin = admin(url, "GET", "/admin/policies")["config"]["deadline_margin"]
    for rnd in range(rounds):
        for order, (side, mode) in enumerate(side_order(rnd, only)):
            set_policies(url, mode)
            time.sleep(5)
            start = time.time()
            by_key = asyncio.run(drive(url, "surge", rate, duration, seed + rnd, factor))
            row = {"round": rnd, "side": side, "order": order, "factor": factor,
                   # its arrivals' epoch seconds: its rows in a kept trace log (--keep-db)
                   "window": [start, start + duration],
                   # the base phase: the first third, before the surge
                   "base_busy": engine_busy(url, start, start + duration / 3),
                   **summarize(by_key, duration),
                   **server_view(server_rows(url, start, time.time()), margin)}
            print(json.dumps(row), flush=True)
            out.append(row)
    set_policies(url, "auto")
    return out


def goal_for(factor: float) -> float:
    """Issue 19: goodput on/off >= 1.5x in every round at 5x and 10x, 1.2x at 3x."""
    return 1.5 if factor >= 5 else 1.2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="on/off pairs, order alternating")
    ap.add_argument("--rate", type=float, default=0.6, help="base requests/s")
    ap.add_argument("--factors", default="3,5,10", help="surge factors, comma-separated")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=100, help="first round's workload seed")
    ap.add_argument("--drill-rate", type=float, default=0.6)
    ap.add_argument("--fault-s", type=float, default=45.0)
    ap.add_argument("--port", type=int, default=8133)
    ap.add_argument("--no-drill", action="store_true", help="the surge rounds only")
    ap.add_argument("--latency-model", help="a trained latency model (tailguard predict "
                    "train); default: none (the live engine model's queue estimate)")
    ap.add_argument("--policies", help="a policy settings file for the server "
                    "(tailguard serve --policies), e.g. to compare prefill_gate_steps")
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="a vLLM engine argument, repeatable (e.g. --engine-arg=--dtype "
                    "--engine-arg=float32)")
    ap.add_argument("--only", choices=[side for side, _ in SIDES],
                    help="run one side only (a single-config recording to replay)")
    ap.add_argument("--keep-db", help="copy the server's trace log here at the end (to "
                    "study the rounds with SQL)")
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    factors = [float(f) for f in args.factors.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        server = start(Path(tmp), args.port, args.latency_model, tuple(args.engine_arg),
                       args.policies)
        try:
            rows = {f: surge_rounds(url, args.rounds, args.rate, args.duration, f, args.seed,
                                    args.only) for f in factors}
            drill = None if args.no_drill else breaker_drill(url, args.drill_rate,
                                                             args.fault_s)
            # how fast this engine was: the same rate is far over capacity on a slower one
            engine = admin(url, "GET", "/admin/policies")["engine_model"]
        finally:
            server.terminate()
            server.wait(timeout=120)
            if args.keep_db:
                shutil.copy(Path(tmp) / "trace.duckdb", args.keep_db)
    print(f"\nmachine: {machine()}; engine model at the end: {json.dumps(engine)}")
    met = True
    for factor, runs in rows.items():
        print(f"\n### {factor:g}x surge over {args.rate:g} req/s")
        judged = report(runs, goal_for(factor))
        met &= judged or args.only is not None  # one side has no on/off ratio to judge
    if drill is not None:
        print("breaker drill:", json.dumps(drill))
        met &= drill["met"]
    if not met:
        sys.exit("a goal was not met (see above)")


if __name__ == "__main__":
    main()
