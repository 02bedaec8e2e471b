"""Benchmark: one server configuration against another on the same workload, by TTFT per
seed-000 length class and goodput.

Two servers on the embedded model run side by side: A with the defaults, B with
`--b-policy FIELD=VALUE` (policy settings, `tailguard serve --policies`),
`--b-engine-arg` (vLLM engine flags) and `--a-checkout`/`--b-checkout` (a source tree
each side serves from: two commits' code, e.g. `git worktree add`); `--engine-arg` goes
to both. Each round drives
the same workload (a `loadgen` scenario over 60/10/30 realtime/VIP/batch keys; the
mixed-length ones put documents among chat prompts) through each, one at a time, the
order alternating. Per run, from the client's clock: TTFT P50/P99 of the served
requests, overall and per length class (classed by seed 000's starting boundaries
256/512, the same on both sides), VIP TTFT P99, and goodput (served on time per
second, refusals charged). The report prints every run and the per-round B/A ratios
with their median and spread.

Seed 000's length classes as an admission order (each lane short class first) against
deadlines alone, under a surge:

    python -m bench.policy.server_ab --rounds 5 --rate 4.0 --factor 3 --seed 100 \
        --b-policy length_class_order=true --engine-arg=--dtype --engine-arg=float32

Small engine steps with vLLM's priority scheduling (docs/policies.md) at light load:

    python -m bench.policy.server_ab --rounds 5 --scenario mixed --rate 0.5 --seed 100 \
        --b-engine-arg=--max-num-batched-tokens --b-engine-arg=512 \
        --b-engine-arg=--long-prefill-token-threshold --b-engine-arg=128 \
        --b-engine-arg=--scheduling-policy --b-engine-arg=priority \
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

import numpy as np

from bench.policy.surge_scoring import retries, server_view, summarize
from bench.policy.surge_server import drive, server_rows, set_policies, start
from slo.policy.length_classes import CLASS_NAMES, class_of

SIDES = ("A", "B")
START_BOUNDS = (256, 512)
GROUPS = ("all", *CLASS_NAMES, "vip")
# the server's view (trace log): of the admitted realtime requests and of the VIP ones,
# the share on time
ATTAINMENTS = ("admitted_realtime_attainment", "vip_attainment")


def ttft_figures(by_key: dict) -> dict:
    """TTFT P50/P99 (client's clock) of the served first attempts, overall and per class."""
    def served(results):
        return [r for r in results if r.status == "ok" and r.ttft_s is not None]
    every = served(r for rs in by_key.values() for r in rs)
    out = {}
    groups = {"all": every, **{name: [r for r in every if r.prompt_tokens is not None
                                      and class_of(r.prompt_tokens, START_BOUNDS) == i]
                               for i, name in enumerate(CLASS_NAMES)},
              "vip": served(by_key.get("vip", []))}
    for name, rs in groups.items():
        values = [r.ttft_s for r in rs]
        out[f"{name}_n"] = len(values)
        out[f"{name}_p50"] = float(np.percentile(values, 50)) if values else None
        out[f"{name}_p99"] = float(np.percentile(values, 99)) if values else None
    return out


def one_run(url: str, scenario: str, rate: float, duration: float, factor: float,
            seed: int, retry_refused: bool = False) -> dict:
    time.sleep(5)
    began = time.time()
    by_key = asyncio.run(drive(url, scenario, rate, duration, seed, factor,
                               retry_refused=retry_refused))
    figures = summarize(by_key, duration)
    served = server_view(server_rows(url, began, time.time()))
    return {"offered": figures["offered"], "ok": figures["ok"], "refused": figures["shed"],
            "goodput_rps": figures["goodput_rps"],
            **{k: served[k] for k in ATTAINMENTS}, "vip": served["vip"],
            "admitted_realtime": served["admitted_realtime"], **ttft_figures(by_key),
            **(retries(by_key) if retry_refused else {})}


def run_sides(args, tmp: Path) -> list[dict]:
    rows, servers, urls = [], [], {}
    try:
        for i, side in enumerate(SIDES):
            path = tmp / side
            path.mkdir()
            policies, engine = None, tuple(args.engine_arg)
            if side == "B":
                engine += tuple(args.b_engine_arg)
                if args.b_policy:
                    policies = path / "policies.yaml"
                    policies.write_text("".join(f"{kv.replace('=', ': ', 1)}\n"
                                                for kv in args.b_policy))
            checkout = args.b_checkout if side == "B" else args.a_checkout
            servers.append(start(path, args.port + i, None, engine,
                                 str(policies) if policies else None, checkout))
            urls[side] = f"http://127.0.0.1:{args.port + i}"
            set_policies(urls[side], "auto")
        for rnd in range(args.rounds):
            order = SIDES if rnd % 2 == 0 else SIDES[::-1]
            for side in order:
                row = {"round": rnd, "side": side, "first": side == order[0],
                       **one_run(urls[side], args.scenario, args.rate, args.duration,
                                 args.factor, args.seed + rnd, args.retry_refused)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=120)
    return rows


def ratios(rows: list[dict], key: str) -> list[float]:
    by_round: dict = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["side"]] = r.get(key)
    return [v["B"] / v["A"] for _, v in sorted(by_round.items())
            if v.get("A") and v.get("B") is not None]


def report(rows: list[dict]) -> dict[str, float]:
    """Every run, then the B/A ratios per round with their median and spread; the
    medians."""
    print("| round | side | first? | offered | served | refused | goodput | admitted realtime "
          "att. | VIP att. | TTFT P50 / P99 (n): all | short | medium | long | VIP |")
    print("|" + "---|" * 13)
    for r in rows:
        cells = [f"{_ms(r[f'{g}_p50'])} / {_ms(r[f'{g}_p99'])} ({r[f'{g}_n']})"
                 for g in GROUPS]
        print(f"| {r['round']} | {r['side']} | {'yes' if r['first'] else 'no'} "
              f"| {r['offered']} | {r['ok']} | {r['refused']} | {r['goodput_rps']:.2f} | "
              f"{_pct(r['admitted_realtime_attainment'])} ({r['admitted_realtime']}) | "
              f"{_pct(r['vip_attainment'])} ({r['vip']}) | " + " | ".join(cells) + " |"
              + (f" retried {r['retried']}, on time {_pct(r['retry_on_time'])}"
                 if "retried" in r else ""))
    medians = {}
    for key in (*(f"{g}_p99" for g in GROUPS), "goodput_rps", *ATTAINMENTS, "retry_on_time"):
        xs = ratios(rows, key)
        if xs:
            medians[key] = statistics.median(xs)
            print(f"{key} B/A per round: {[round(x, 3) for x in xs]}, median "
                  f"{medians[key]:.3f} (min {min(xs):.3f}, max {max(xs):.3f})")
    return medians


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.0f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scenario", default="surge", help="a loadgen scenario")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--factor", type=float, default=3.0, help="the surge's factor")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--port", type=int, default=8150)
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="a vLLM engine flag for both servers (repeat)")
    ap.add_argument("--b-engine-arg", action="append", default=[],
                    help="a vLLM engine flag for B only (repeat)")
    ap.add_argument("--b-policy", action="append", default=[], metavar="FIELD=VALUE",
                    help="a policy setting for B only (repeat)")
    ap.add_argument("--a-checkout", type=Path, help="a source tree A serves from")
    ap.add_argument("--b-checkout", type=Path, help="a source tree B serves from")
    ap.add_argument("--retry-refused", action="store_true",
                    help="send a refused request once more after its Retry-After")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_sides(args, Path(tmp))
    report(rows)


if __name__ == "__main__":
    main()
