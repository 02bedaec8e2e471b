"""Benchmark: degradation policies on vs off under a 3x surge, and breaker recovery.

One tailguard server on the embedded model (48 MiB KV cache, a keys file with
realtime, VIP and batch clients). Each round runs the `surge` workload (mixed
context lengths, 3x rate through the middle third) once per side, policies off (every
policy forced off, batch control too) and on (all auto); the side that runs first
alternates (even rounds off first, odd rounds on first), so neither side always meets
the warmer or the noisier machine. Every run is printed as it ends, then a table of
every round, the per-round on/off ratios, their median and spread (min-max), and the
goal's verdict. Traffic: 60% realtime, 10% VIP, 30% batch keys.

Figures per run (the scoring functions below are pure and unit-tested):
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

    python bench/policy_surge.py --rounds 5 --rate 4 --duration 150 \
        --latency-model traces/diurnal.duckdb.models/latency.pkl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from observe.registry import PRIORITY_REALTIME
from tailguard.launcher import wait_ready
from loadgen.runner import Target, run
from loadgen.workload import Workload
from slo.targets import DEFAULT_TTFT_TARGET

KEYS = {"realtime": ("sk-bench-rt", 0.6), "vip": ("sk-bench-vip", 0.1),
        "batch": ("sk-bench-batch", 0.3)}
KEYS_YAML = """keys:
  - {name: rt, key: sk-bench-rt, tier: realtime}
  - {name: vip, key: sk-bench-vip, tier: realtime, vip: true}
  - {name: bulk, key: sk-bench-batch, tier: batch}
"""
TOKEN = "bench-admin-token"
POLICIES = ("breaker_l1", "breaker_l2", "token_cap", "vip_only", "memory_pressure",
            "truncation", "predicted_miss", "batch_control")


def start(tmp: Path, port: int, latency_model: str | None) -> subprocess.Popen:
    (tmp / "keys.yaml").write_text(KEYS_YAML)
    if latency_model:  # what the server would have learnt from earlier traffic
        (tmp / "models").mkdir()
        shutil.copy(latency_model, tmp / "models" / "latency.pkl")
    log = tmp / "server.log"
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port),
           "--db", str(tmp / "trace.duckdb"), "--keys", str(tmp / "keys.yaml"),
           "--enable-fault-injection", "--retrain-interval", "0",
           "--model-dir", str(tmp / "models"),
           "--", "--kv-cache-memory-bytes", str(48 * 1024 * 1024)]
    env = {**__import__("os").environ, "TAILGUARD_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    wait_ready(f"http://127.0.0.1:{port}", proc, log)
    return proc


def admin(url: str, method: str, path: str, body: dict | None = None) -> dict:
    resp = httpx.request(method, url + path, json=body, timeout=30,
                         headers={"Authorization": f"Bearer {TOKEN}"})
    resp.raise_for_status()
    return resp.json()


def set_policies(url: str, mode: str) -> None:
    for name in POLICIES:
        admin(url, "PUT", f"/admin/policies/{name}", {"mode": mode, "reason": "benchmark side"})


async def drive(url: str, scenario: str, rate: float, duration: float, seed: int) -> dict:
    """Run one workload split over the three keys; results per key."""
    runs = {}
    for i, (kind, (key, share)) in enumerate(KEYS.items()):
        workload = Workload(scenario, rate * share, duration, 100_000, seed=seed * 10 + i)
        runs[kind] = run(Target(url, "tailguard-tiny-llama", key, timeout_s=120, drain_s=60),
                         workload)
    results = await asyncio.gather(*runs.values())
    return dict(zip(runs, results))


def meets(r) -> bool:
    return (r.status == "ok" and r.ttft_s is not None and r.prompt_tokens is not None
            and r.ttft_s <= DEFAULT_TTFT_TARGET(r.prompt_tokens))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request's user asked for and got."""
    served: bool  # answered in full (status ok); shed, refused or failed: False
    met: bool  # first token within its context-aware TTFT target
    output_asked: int  # max_tokens sent
    output_got: int  # completion tokens received
    prompt_asked: int  # prompt tokens sent
    prompt_kept: int  # prompt tokens the engine saw (fewer when truncated)


def credit(o: Outcome) -> float:
    """0 when shed, failed or late; else the share of the asked output and prompt kept."""
    if not (o.served and o.met):
        return 0.0
    output = min(1.0, o.output_got / o.output_asked) if o.output_asked > 0 else 1.0
    prompt = min(1.0, o.prompt_kept / o.prompt_asked) if o.prompt_asked > 0 else 1.0
    return output * prompt


def goodput(outcomes: list[Outcome], duration: float) -> float:
    """Requests served on time per second; a capped or truncated request counts 1."""
    return sum(o.served and o.met for o in outcomes) / duration


def smooth_goodput(outcomes: list[Outcome], duration: float) -> float:
    """Credit per second: what the users got on time, in whole requests."""
    return sum(credit(o) for o in outcomes) / duration


def goodput_per_served(outcomes: list[Outcome]) -> float | None:
    """On-time share of the served requests: shedding the hard ones games it (shown
    for contrast; never the verdict)."""
    served = [o for o in outcomes if o.served]
    return sum(o.met for o in served) / len(served) if served else None


def outcome(r) -> Outcome:
    """A client result as an outcome; the client sees no truncation (see `truncated`)."""
    prompt = r.prompt_tokens or 0
    return Outcome(r.status == "ok", meets(r), r.max_tokens, r.output_tokens, prompt, prompt)


def demoted(row: dict) -> bool:
    return any(a.startswith("demote:") for a in row["policy_actions"] or ())


def refused_before_admission(row: dict) -> bool:
    return any(a.startswith(("shed:", "reject:")) for a in row["policy_actions"] or ())


def lane_attainment(rows: list[dict]) -> tuple[int, float | None]:
    """(requests that entered the realtime lane, share served on time and never demoted
    out of it) from trace-log rows; a demoted request is a miss of the lane."""
    lane = [r for r in rows if (r["priority"] == PRIORITY_REALTIME or demoted(r))
            and not refused_before_admission(r)]
    met = sum(r["status"] == "ok" and not demoted(r) and r["ttft_s"] is not None
              and r["slo_ttft_target_s"] is not None and r["ttft_s"] <= r["slo_ttft_target_s"]
              for r in lane)
    return len(lane), (met / len(lane) if lane else None)


def summarize(by_key: dict, duration: float) -> dict:
    """Client-side figures of one run."""
    every = [outcome(r) for rs in by_key.values() for r in rs]
    realtime = [outcome(r) for kind in ("realtime", "vip") for r in by_key[kind]]
    return {"offered": len(every), "ok": sum(o.served for o in every),
            "shed": sum(r.http_status == 503 for rs in by_key.values() for r in rs),
            "not_served": dict(Counter(r.error_type for rs in by_key.values() for r in rs
                                       if r.status != "ok")),
            "goodput_rps": goodput(every, duration),
            "smooth_goodput_rps": smooth_goodput(every, duration),
            "goodput_per_served": goodput_per_served(every),
            "realtime_key_attainment": (sum(credit(o) > 0 for o in realtime) / len(realtime)
                                        if realtime else None)}


def server_view(rows: list[dict]) -> dict:
    """Trace-log figures of one run: the realtime lane, demotions, truncations."""
    entered, attained = lane_attainment(rows)
    truncated = sum(any(a.startswith("truncate:") for a in r["policy_actions"] or ())
                    for r in rows)
    return {"realtime_lane": entered, "realtime_lane_attainment": attained,
            "demoted": sum(demoted(r) for r in rows), "truncated": truncated,
            "smooth_exact": truncated == 0}


ROWS_SQL = """
SELECT priority, status, ttft_s, slo_ttft_target_s, policy_actions
FROM requests WHERE epoch(arrival_ts) BETWEEN {start} AND {end}
"""


def server_rows(url: str, start: float, end: float) -> list[dict]:
    """The trace-log rows of the requests that arrived between `start` and `end`."""
    admin(url, "POST", "/admin/flush")
    data = admin(url, "POST", "/admin/query",
                 {"sql": ROWS_SQL.format(start=start, end=end), "max_rows": 100_000})
    if data.get("truncated"):
        raise RuntimeError("more trace-log rows than one query answers")
    return [dict(zip(data["columns"], row)) for row in data["rows"]]


SIDES = (("off", "force_off"), ("on", "auto"))
GOAL_RATIO = 1.5  # smooth goodput on / off, median over the rounds


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


def compare(rows: list[dict], key: str, goal: float = GOAL_RATIO) -> dict:
    """Per-round on/off ratios of `key`, their median and spread, and the verdict: met
    when the median ratio reaches `goal` (a round with off at 0 has no ratio)."""
    by_round: dict = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["side"]] = row[key]
    ratios = [r["on"] / r["off"] for _, r in sorted(by_round.items())
              if "on" in r and "off" in r and r["off"]]
    if not ratios:
        return {"ratios": [], "median": None, "min": None, "max": None, "on_wins": 0,
                "met": False}
    median = statistics.median(ratios)
    return {"ratios": ratios, "median": median, "min": min(ratios), "max": max(ratios),
            "on_wins": sum(x > 1 for x in ratios), "met": median >= goal}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report(rows: list[dict]) -> None:
    """Every run, then the ratios with their median and spread, and the verdict."""
    print("| round | side | first? | offered | served | shed | goodput | smooth goodput "
          "| realtime-key att. | realtime lane | lane att. (demoted = miss) | demoted "
          "| truncated |")
    print("|" + "---|" * 13)
    for r in rows:
        print(f"| {r['round']} | {r['side']} | {'yes' if r['order'] == 0 else 'no'} "
              f"| {r['offered']} | {r['ok']} | {r['shed']} | {r['goodput_rps']:.2f} "
              f"| {r['smooth_goodput_rps']:.2f} | {_pct(r['realtime_key_attainment'])} "
              f"| {r['realtime_lane']} | {_pct(r['realtime_lane_attainment'])} "
              f"| {r['demoted']} | {r['truncated']} |")
    for key in ("goodput_rps", "smooth_goodput_rps"):
        c = compare(rows, key)
        spread = (f"median {c['median']:.2f} (min {c['min']:.2f}, max {c['max']:.2f})"
                  if c["ratios"] else "no ratio")
        print(f"{key} on/off per round: {[round(x, 2) for x in c['ratios']]}, {spread}, "
              f"on ahead in {c['on_wins']} of {len(c['ratios'])}")
    verdict = compare(rows, "smooth_goodput_rps")
    print(f"goal: smooth goodput on/off >= {GOAL_RATIO}x (median): "
          f"{'met' if verdict['met'] else 'NOT met'}")
    if not all(r["smooth_exact"] for r in rows):
        print("warning: the server truncated prompts; smooth goodput credits them in "
              "full (the client cannot see truncation)")


DRILL_WINDOWS = ((0, 10), (10, 20), (20, 30))  # seconds after the clear, by arrival
RECOVERED_SHARE = 0.9  # goal: the last window's attainment >= 90% of the baseline's


def attainment(results: list) -> float | None:
    """Share of the requests sent that met their TTFT target; shed or failed ones miss."""
    return sum(meets(r) for r in results) / len(results) if results else None


def drill_recovery(results: list, fault_s: float, clear_s: float) -> dict:
    """SLO attainment by arrival time (`sent_s`, seconds after the run started): the
    10 s before the fault, and each window of DRILL_WINDOWS after the clear. A request
    sent before the clear and served after it is the backlog, not recovery: it counts
    in no window after the clear."""
    def sent(lo: float, hi: float) -> list:
        return [r for r in results if lo <= r.sent_s < hi]

    base = attainment(sent(fault_s - 10, fault_s))
    after = {f"{lo}-{hi}s": attainment(sent(clear_s + lo, clear_s + hi))
             for lo, hi in DRILL_WINDOWS}
    last = after[f"{DRILL_WINDOWS[-1][0]}-{DRILL_WINDOWS[-1][1]}s"]
    recovered = last / base if base and last is not None else None
    return {"baseline_attainment": base, "attainment_after_clear": after,
            "recovered": recovered,
            "met": recovered is not None and recovered >= RECOVERED_SHARE}


def breaker_drill(url: str, rate: float, fault_s: float) -> dict:
    """Steady load; a slow engine from 30 s for `fault_s`; recovery by arrival."""
    async def scenario():
        load = asyncio.create_task(drive(url, "steady", rate, 30 + fault_s + 40, 99))
        await asyncio.sleep(30)
        admin(url, "PUT", "/admin/faults", {"mode": "slow", "delay_s": 2.0})
        fault_at = time.monotonic()
        await asyncio.sleep(fault_s)
        admin(url, "PUT", "/admin/faults", {"mode": "none"})
        clear_at = time.monotonic()
        return await load, fault_at, clear_at

    started = time.monotonic()
    by_key, fault_at, clear_at = asyncio.run(scenario())
    every = [r for rs in by_key.values() for r in rs]
    events = admin(url, "GET", "/admin/audit")["events"]
    return {**drill_recovery(every, fault_at - started, clear_at - started),
            "breaker_events": [(e["from_state"], e["to_state"]) for e in events
                               if e["policy"] == "breaker_l1"][::-1]}


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
