"""Benchmark: degradation policies on vs off under a 3x surge, and breaker recovery.

One tailguard server on the embedded model (48 MiB KV cache, a keys file with
realtime, VIP and batch clients). Each round runs the `surge` workload (mixed
context lengths, 3x rate through the middle third) twice, policies off (every
policy forced off, batch control too) then on (all auto), alternating so both sides
see the same machine noise. Traffic: 60% realtime, 10% VIP, 30% batch keys.

Then a breaker drill: steady load, an injected slow engine long enough to trip
breaker L1, the fault cleared, and the SLO attainment of the requests that *arrive*
after the clear against those that arrived before the fault. (Throughput after the
clear would count the backlog of the fault draining as recovery.)

    python bench/policy_surge.py --rounds 2 --rate 4 --duration 150 \
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
from pathlib import Path

import httpx

from serving.launcher import wait_ready
from serving.loadgen import Target, run
from serving.workload import Workload
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


def summarize(by_key: dict, duration: float) -> dict:
    every = [r for rs in by_key.values() for r in rs]
    realtime = [r for kind in ("realtime", "vip") for r in by_key[kind] if r.status == "ok"]
    shed = sum(r.http_status == 503 for r in every)
    return {"offered": len(every), "ok": sum(r.status == "ok" for r in every), "shed": shed,
            "goodput_rps": sum(meets(r) for r in every) / duration,
            "realtime_admitted": len(realtime),
            "realtime_attainment": (sum(meets(r) for r in realtime) / len(realtime)
                                    if realtime else None)}


LANES_SQL = """
SELECT count(*) FILTER (WHERE status = 'ok' AND priority = 'realtime') AS realtime_lane,
       avg(CASE WHEN ttft_s <= slo_ttft_target_s THEN 1.0 ELSE 0.0 END)
           FILTER (WHERE status = 'ok' AND priority = 'realtime') AS realtime_lane_attainment,
       count(*) FILTER (WHERE list_contains(policy_actions, 'demote:predicted_miss'))
           AS demoted
FROM requests WHERE epoch(arrival_ts) BETWEEN {start} AND {end}
"""


def lanes(url: str, start: float, end: float) -> dict:
    """Server-side view of one side: requests still in the realtime lane when served
    (a predicted miss is demoted to the batch lane), and their attainment."""
    admin(url, "POST", "/admin/flush")
    data = admin(url, "POST", "/admin/query", {"sql": LANES_SQL.format(start=start, end=end)})
    return dict(zip(data["columns"], data["rows"][0]))


def surge_rounds(url: str, rounds: int, rate: float, duration: float) -> list[dict]:
    out = []
    for rnd in range(rounds):
        for side, mode in (("off", "force_off"), ("on", "auto")):
            set_policies(url, mode)
            time.sleep(5)
            start = time.time()
            by_key = asyncio.run(drive(url, "surge", rate, duration, rnd))
            row = {"round": rnd, "side": side, **summarize(by_key, duration),
                   **lanes(url, start, time.time())}
            print(json.dumps(row), flush=True)
            out.append(row)
    set_policies(url, "auto")
    return out


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
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=2.5, help="base requests/s (surge 3x)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--drill-rate", type=float, default=2.0)
    ap.add_argument("--fault-s", type=float, default=45.0)
    ap.add_argument("--port", type=int, default=8133)
    ap.add_argument("--latency-model", help="a trained latency model (tailguard predict "
                    "train) for the predicted-miss policy; default: the seed formula")
    args = ap.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        server = start(Path(tmp), args.port, args.latency_model)
        try:
            rows = surge_rounds(url, args.rounds, args.rate, args.duration)
            drill = breaker_drill(url, args.drill_rate, args.fault_s)
        finally:
            server.terminate()
            server.wait(timeout=120)
    for side in ("off", "on"):
        mine = [r for r in rows if r["side"] == side]
        print(side, "goodput", [round(r["goodput_rps"], 3) for r in mine],
              "attainment", [r["realtime_attainment"] for r in mine])
    ratios = [on["goodput_rps"] / off["goodput_rps"] for off, on in
              zip(rows[::2], rows[1::2]) if off["goodput_rps"]]
    if ratios:
        print(f"goodput on/off per round: {[round(x, 2) for x in ratios]}, "
              f"median {statistics.median(ratios):.2f}")
    print("breaker drill:", json.dumps(drill))
    if not drill["met"]:
        sys.exit(f"breaker drill: attainment of requests arriving "
                 f"{DRILL_WINDOWS[-1][0]}-{DRILL_WINDOWS[-1][1]} s after the clear is "
                 f"below {RECOVERED_SHARE:.0%} of the baseline's")


if __name__ == "__main__":
    main()
