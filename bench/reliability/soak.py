"""Soak: the server at 80% of its measured capacity for 10 minutes.

Capacity is measured on a first server: the closed-loop throughput of `--clients`
for `--capacity-s` (the most it completes, queues included), then the SLO capacity:
Poisson arrivals stepped up through `--steps` fractions of that, `--step-s` each;
the highest rate whose TTFT P99 stays under the breaker's threshold with no non-200
response. A fresh server (so the search leaves no burn or policy behind) then gets
Poisson arrivals at `--fraction` of the SLO capacity for `--duration` seconds,
sampled every `--every` seconds: resident memory of the server process and of its
engine processes, the trace writer's pending and dropped rows (GET /admin/tracelog),
errors and TTFT. Prints a summary table and writes the samples (JSON) and a figure.

    python -m bench.reliability.soak --out docs/soak   # 16-19 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from bench.common import start_tailguard
from slo.policy.conditions import PolicyConfig
from slo.policy.live_windows import quantile

TOKEN = "soak-bench-admin-token"
WORDS = ("the of and to in is that for it as with be on not this are by or an from at "
         "which if can when value time list each first new number").split()


def start_server(db: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=TOKEN)
    return start_tailguard(port, ["--db", str(db), "--retrain-interval", "0"],
                           db.with_suffix(".server.log"), env, start_new_session=True)


def body(rng: random.Random) -> dict:
    words = rng.randint(200, 500)
    return {"model": "tailguard-tiny-llama", "max_tokens": rng.randint(16, 48),
            "prompt": " ".join(rng.choice(WORDS) for _ in range(words)), "stream": True}


async def one(client: httpx.AsyncClient, url: str, rng: random.Random, results: list) -> None:
    start = time.monotonic()
    ttft, status = None, 0
    try:
        async with client.stream("POST", url + "/v1/completions", json=body(rng)) as resp:
            status = resp.status_code
            async for line in resp.aiter_lines():
                if ttft is None and line.startswith("data: {"):
                    ttft = time.monotonic() - start
    except httpx.HTTPError:
        status = -1
    results.append((time.monotonic(), status, ttft))


async def capacity(url: str, clients: int, seconds: float) -> float:
    results: list = []
    rng = random.Random(1)
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=120) as client:
        async def loop():
            while time.monotonic() < end:
                await one(client, url, rng, results)
        await asyncio.gather(*(loop() for _ in range(clients)))
    return sum(1 for _, s, _ in results if s == 200) / seconds


def resident(pid: int) -> dict[str, int]:
    """RSS of the server process and of its engine processes (vLLM's EngineCore and
    Worker), in bytes."""
    proc = psutil.Process(pid)
    out = {"server": proc.memory_info().rss, "engine": 0}
    for child in proc.children(recursive=True):
        try:
            out["engine"] += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return out


async def offer(url: str, rate: float, duration: float, seed: int,
                on_tick=None, every: float = 10.0) -> list:
    """Poisson arrivals at `rate` for `duration` seconds; waits for them all. Calls
    `on_tick(client, start, results)` every `every` seconds when given."""
    results: list = []
    rng = random.Random(seed)
    start = time.monotonic()
    tasks = set()
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=512)) as client:
        next_tick, next_arrival = start, start
        while time.monotonic() - start < duration:
            now = time.monotonic()
            if now >= next_arrival:
                task = asyncio.create_task(one(client, url, rng, results))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_arrival += rng.expovariate(rate)
            if on_tick is not None and now >= next_tick:
                await on_tick(client, start, results)
                next_tick += every
            wake = min(next_arrival, next_tick) if on_tick is not None else next_arrival
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
        await asyncio.gather(*tasks)
        if on_tick is not None:
            await on_tick(client, start, results)
    return results


def p99(values: list[float]) -> float | None:
    """Nearest-rank P99, as the breaker computes it (`slo.policy.live_windows.quantile`)."""
    return quantile(values, 0.99)


async def slo_capacity(url: str, closed_loop: float, fractions: list[float], step_s: float,
                       p99_limit: float) -> tuple[float, list[dict]]:
    """The highest stepped Poisson rate with TTFT P99 <= `p99_limit` and only 200s;
    stops at the first step that fails."""
    steps, best = [], 0.0
    for i, fraction in enumerate(fractions):
        rate = fraction * closed_loop
        results = await offer(url, rate, step_s, seed=10 + i)
        ttft = p99([t for _, s, t in results if s == 200 and t is not None])
        errors = sum(1 for _, s, _ in results if s != 200)
        ok = errors == 0 and ttft is not None and ttft <= p99_limit
        steps.append({"fraction": fraction, "rate": rate, "requests": len(results),
                      "errors": errors, "ttft_p99_s": ttft, "ok": ok})
        print(f"step {fraction:.0%}: {rate:.2f} req/s, TTFT p99 {ttft:.2f} s, "
              f"{errors} errors", flush=True)
        if not ok:
            break
        best = rate
    return best, steps


async def soak(url: str, pid: int, rate: float, duration: float, every: float) -> list[dict]:
    samples: list[dict] = []

    async def tick(client, start, results):
        samples.append(await sample(client, url, pid, start, results, every))

    await offer(url, rate, duration, seed=2, on_tick=tick, every=every)
    return samples


async def sample(client, url, pid, start, results, every) -> dict:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    stats = (await client.get(url + "/admin/tracelog", headers=auth)).json()
    duck = (await client.post(url + "/admin/query", headers=auth, json={
        "sql": "SELECT sum(memory_usage_bytes) FROM duckdb_memory()"})).json()
    now = time.monotonic()
    recent = [r for r in results if r[0] > now - every]
    rss = resident(pid)
    return {"t": now - start, "rss_bytes": rss["server"] + rss["engine"],
            "rss_server_bytes": rss["server"], "rss_engine_bytes": rss["engine"],
            "duckdb_bytes": duck["rows"][0][0],
            "done": len(results), "errors": sum(1 for _, s, _ in results if s != 200),
            "pending_rows": stats["pending_rows"],
            "dropped_rows": sum(stats["rows_dropped"].values()),
            "ttft_p99_s": p99([t for _, s, t in recent if s == 200 and t is not None]),
            "rps": len(recent) / every}


def growth(samples: list[dict], key: str) -> tuple[float, float, float]:
    """Mean of `key` over minute 2 and over the last minute (MiB), and the growth."""
    warm = [s[key] for s in samples if 60 <= s["t"] < 120]
    last = [s[key] for s in samples if s["t"] >= samples[-1]["t"] - 60]
    a, b = statistics.mean(warm) / 2**20, statistics.mean(last) / 2**20
    return a, b, b / a - 1


def summarise(samples: list[dict], closed_loop: float, capacity_rps: float,
              rate: float, fraction: float) -> str:
    end = samples[-1]
    rows = [("capacity, closed loop", f"{closed_loop:.2f} req/s"),
            ("capacity at SLO (TTFT P99 under the breaker)", f"{capacity_rps:.2f} req/s"),
            (f"offered ({fraction:.0%} of capacity at SLO)", f"{rate:.2f} req/s"),
            ("requests completed", str(end["done"])), ("errors (non-200)", str(end["errors"]))]
    for label, key in (("RSS, server + engine", "rss_bytes"), ("RSS, server", "rss_server_bytes"),
                       ("RSS, engine", "rss_engine_bytes")):
        a, b, g = growth(samples, key)
        rows.append((f"{label}, minute 2 -> last minute (MiB)", f"{a:.0f} -> {b:.0f} ({g:+.2%})"))
    a, b, _ = growth(samples, "duckdb_bytes")
    rows.append(("DuckDB memory (its cache), minute 2 -> last minute (MiB)", f"{a:.0f} -> {b:.0f}"))
    rows += [("trace rows pending, max", str(max(s["pending_rows"] for s in samples))),
             ("trace rows dropped", str(end["dropped_rows"]))]
    return "\n".join(["| measure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def figure(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    for key, label in (("rss_bytes", "server + engine"), ("rss_engine_bytes", "engine"),
                       ("rss_server_bytes", "server"), ("duckdb_bytes", "DuckDB (in server)")):
        axes[0].plot(t, [s[key] / 2**20 for s in samples], label=label)
    axes[0].set_ylabel("RSS (MiB)")
    axes[0].legend(fontsize="small")
    axes[1].plot(t, [s["ttft_p99_s"] for s in samples])
    axes[1].set_ylabel("TTFT p99 (s)")
    axes[2].plot(t, [s["pending_rows"] for s in samples], label="pending")
    axes[2].plot(t, [s["dropped_rows"] for s in samples], label="dropped")
    axes[2].set_ylabel("trace rows")
    axes[2].set_xlabel("minutes")
    axes[2].legend()
    fig.suptitle("tailguard soak at 80% of capacity")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def measure_capacity(args) -> tuple[float, float, list[dict]]:
    db = Path(f"/tmp/tailguard-soak-capacity-{os.getpid()}.duckdb")
    server = start_server(db, args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        closed = asyncio.run(capacity(url, args.clients, args.capacity_s))
        print(f"closed loop: {closed:.2f} req/s", flush=True)
        fractions = [float(f) for f in args.steps.split(",")]
        best, steps = asyncio.run(slo_capacity(url, closed, fractions, args.step_s,
                                               PolicyConfig().breaker_p99_s))
    finally:
        server.terminate()
        server.wait(timeout=120)
    return closed, best, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("soak"), help="prefix for .json/.png")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--capacity-s", type=float, default=60.0)
    ap.add_argument("--steps", default="0.5,0.6,0.7,0.8,0.9,1.0",
                    help="fractions of the closed-loop capacity to step through")
    ap.add_argument("--step-s", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--port", type=int, default=8141)
    args = ap.parse_args()
    closed, capacity_rps, steps = measure_capacity(args)
    if capacity_rps <= 0:
        sys.exit(f"no step met the SLO: {steps}")
    rate = args.fraction * capacity_rps
    server = start_server(Path(f"/tmp/tailguard-soak-{os.getpid()}.duckdb"), args.port)
    try:
        samples = asyncio.run(soak(f"http://127.0.0.1:{args.port}", server.pid, rate,
                                   args.duration, args.every))
    finally:
        server.terminate()
        server.wait(timeout=120)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"closed_loop_rps": closed, "capacity_rps": capacity_rps, "steps": steps,
         "rate": rate, "samples": samples}, indent=1))
    figure(samples, args.out.with_suffix(".png"))
    print(summarise(samples, closed, capacity_rps, rate, args.fraction))


if __name__ == "__main__":
    main()
