"""Benchmark: of a recorded surge's late VIP requests, how many could any order have
served on time?

Issue 19 asks for 99.9% of VIP requests on time. Whether a scheduler can reach that
depends on how much VIP work arrives due at once, not only on the scheduler. This
replays each run of a recording (`bench.policy.surge --keep-db`) on the engine model
calibrated from it (`tailguard replay`'s, slo.sim) twice, with nothing but that run's
VIP requests:
- alone: the run's VIPs only, in deadline order (priority scheduling, the default
  policies): the engine given to VIPs and nobody else;
- isolated: each VIP by itself on an idle engine: its own prefill against its target.
A VIP late in "isolated" is late under any order on this engine; one late in "alone"
is late unless VIPs were served in some better order than earliest deadline (which
minimises the worst lateness on one machine). Late VIPs the server had beyond those
are the ones that other traffic made late: the part a scheduler can still win.

The TTFT here is the server's (arrival to first token, its trace row), as the
simulator's; the surge bench's VIP attainment uses the client's clock, a few ms later.
Runs are told apart by a pause in arrivals (the surge bench waits 5 s between runs).

    python -m bench.policy.vip_bound --db on.duckdb [--calibrate-from other.duckdb] \
        [--chunk-cap 0]
"""

from __future__ import annotations

import argparse
import json

from slo.policy.conditions import PolicyConfig
from slo.sim import replay as rp
from slo.sim.engine_model import EngineModel
from slo.sim.report import calibrated_recording
from slo.sim.request import SimRequest
from tailguard.cmd_replay import recording_query

RUN_GAP_S = 4.0  # a pause in arrivals this long starts a new run


def runs_of(requests: list[dict], gap_s: float = RUN_GAP_S) -> list[list[dict]]:
    """The recording's requests split where arrivals pause for `gap_s` or more."""
    runs: list[list[dict]] = []
    last = None
    for r in requests:
        if last is None or r["t"] - last >= gap_s:
            runs.append([])
        runs[-1].append(r)
        last = r["t"]
    return runs


def late_count(model: EngineModel, vips: list[SimRequest], horizon_s: float) -> int:
    rp.simulate(model, PolicyConfig(), vips, horizon_s)  # marks each request
    return sum(1 for r in vips if not r.good)


def as_sim(rows: list[dict], start: float) -> list[SimRequest]:
    """The rows as `tailguard replay` replays them, their clock starting at `start`."""
    requests = rp.Recorded(rows, 60.0).arrivals()
    for r in requests:
        r.arrival -= start
    return requests


def bound_of_run(model: EngineModel, run: list[dict]) -> dict:
    start = run[0]["t"]
    vips = [r for r in run if r["vip"] and r["prompt_tokens"]]
    served_late = sum(1 for r in vips if r["ttft_s"] is None
                      or r["ttft_s"] > r["slo_ttft_target_s"])
    horizon = run[-1]["t"] - start + 60.0
    alone = late_count(model, as_sim(vips, start), horizon)
    isolated = sum(late_count(model, as_sim([r], r["t"]), 60.0) for r in vips)
    return {"requests": len(run), "vips": len(vips), "late_served": served_late,
            "late_alone": alone, "late_isolated": isolated}


def table(rows: list[dict]) -> str:
    lines = ["| run | requests | VIPs | late as served | late, VIPs alone | late, each alone |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i} | {r['requests']} | {r['vips']} | {r['late_served']} | "
                     f"{r['late_alone']} | {r['late_isolated']} |")
    if rows:
        total = {k: sum(r[k] for r in rows) for k in rows[0]}
        lines.append(f"| all | {total['requests']} | {total['vips']} | "
                     f"{total['late_served']} | {total['late_alone']} | "
                     f"{total['late_isolated']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="a recorded trace log (surge --keep-db)")
    ap.add_argument("--calibrate-from", help="fit the engine model on this log instead")
    ap.add_argument("--gap", type=float, default=RUN_GAP_S,
                    help="seconds without arrivals that separate two runs")
    ap.add_argument("--chunk-cap", type=int, default=256,
                    help="the engine's prefill chunk cap, as `tailguard replay --chunk-cap` "
                    "(default: tailguard serve's, 256, adaptive; 0: none)")
    ap.add_argument("--fixed-cap", action="store_true", help="the cap as a fixed one")
    args = ap.parse_args()

    model, recorded = calibrated_recording(
        recording_query(args.db),
        recording_query(args.calibrate_from) if args.calibrate_from else None)
    model = model.with_chunk_cap(args.chunk_cap, args.fixed_cap)
    rows = [bound_of_run(model, run) for run in runs_of(recorded.requests, args.gap)]
    print(json.dumps({"model": model.describe(), "runs": rows}))
    print(table(rows))


if __name__ == "__main__":
    main()
