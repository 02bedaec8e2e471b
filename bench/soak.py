"""Soak: the server at 80% of its measured capacity for 10 minutes.

Starts a tailguard server on the embedded model with its own trace file, measures
capacity (completed requests/s of a closed loop of `--clients` for `--capacity-s`),
then offers Poisson arrivals at `--fraction` of it for `--duration` seconds and
samples every `--every` seconds: resident memory of the server and its engine
processes, the trace writer's pending and dropped rows (GET /admin/tracelog), errors
and TTFT. Prints a summary table and writes the samples (JSON) and a figure (PNG).

    python bench/soak.py --out docs/soak   # about 12 minutes
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serving.launcher import wait_ready  # noqa: E402

TOKEN = "soak-token"
WORDS = ("the of and to in is that for it as with be on not this are by or an from at "
         "which if can when value time list each first new number").split()


def start_server(db: Path, port: int) -> subprocess.Popen:
    log = db.with_suffix(".server.log")
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=TOKEN)
    process = subprocess.Popen(
        [sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db", str(db),
         "--retrain-interval", "0"], stdout=log.open("w"), stderr=subprocess.STDOUT,
        env=env, start_new_session=True)
    wait_ready(f"http://127.0.0.1:{port}", process, log)
    return process


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


def resident(pid: int) -> int:
    proc = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])


async def soak(url: str, pid: int, rate: float, duration: float, every: float) -> list[dict]:
    results: list = []
    samples: list[dict] = []
    rng = random.Random(2)
    start = time.monotonic()
    tasks = set()
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=512)) as client:
        next_sample, next_arrival = start, start
        while time.monotonic() - start < duration:
            now = time.monotonic()
            if now >= next_arrival:
                task = asyncio.create_task(one(client, url, rng, results))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_arrival += rng.expovariate(rate)
            if now >= next_sample:
                samples.append(await sample(client, url, pid, start, results, every))
                next_sample += every
            await asyncio.sleep(max(0.0, min(next_arrival, next_sample) - time.monotonic()))
        await asyncio.gather(*tasks)
        samples.append(await sample(client, url, pid, start, results, every))
    return samples


async def sample(client, url, pid, start, results, every) -> dict:
    stats = (await client.get(url + "/admin/tracelog",
                              headers={"Authorization": f"Bearer {TOKEN}"})).json()
    now = time.monotonic()
    recent = [r for r in results if r[0] > now - every]
    ttfts = sorted(t for _, s, t in recent if s == 200 and t is not None)
    return {"t": now - start, "rss_bytes": resident(pid), "done": len(results),
            "errors": sum(1 for _, s, _ in results if s != 200),
            "pending_rows": stats["pending_rows"],
            "dropped_rows": sum(stats["rows_dropped"].values()),
            "ttft_p99_s": ttfts[int(0.99 * (len(ttfts) - 1))] if ttfts else None,
            "rps": len(recent) / every}


def summarise(samples: list[dict], capacity_rps: float, rate: float) -> str:
    warm = [s["rss_bytes"] for s in samples if 60 <= s["t"] < 120]
    last = [s["rss_bytes"] for s in samples if s["t"] >= samples[-1]["t"] - 60]
    growth = statistics.mean(last) / statistics.mean(warm) - 1 if warm and last else float("nan")
    end = samples[-1]
    rows = [("capacity (closed loop)", f"{capacity_rps:.2f} req/s"),
            ("offered (80%)", f"{rate:.2f} req/s"),
            ("requests completed", str(end["done"])), ("errors (non-200)", str(end["errors"])),
            ("RSS, minute 2 (MiB)", f"{statistics.mean(warm) / 2**20:.0f}" if warm else "-"),
            ("RSS, last minute (MiB)", f"{statistics.mean(last) / 2**20:.0f}"),
            ("RSS growth", f"{growth:+.2%}"),
            ("trace rows pending, max", str(max(s["pending_rows"] for s in samples))),
            ("trace rows dropped", str(end["dropped_rows"]))]
    return "\n".join(["| measure | value |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def figure(samples: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    axes[0].plot(t, [s["rss_bytes"] / 2**20 for s in samples])
    axes[0].set_ylabel("RSS (MiB)")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("soak"), help="prefix for .json/.png")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--capacity-s", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--port", type=int, default=8141)
    args = ap.parse_args()
    db = Path(f"/tmp/tailguard-soak-{os.getpid()}.duckdb")
    server = start_server(db, args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        capacity_rps = asyncio.run(capacity(url, args.clients, args.capacity_s))
        rate = args.fraction * capacity_rps
        samples = asyncio.run(soak(url, server.pid, rate, args.duration, args.every))
    finally:
        server.terminate()
        server.wait(timeout=120)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"capacity_rps": capacity_rps, "rate": rate, "samples": samples}, indent=1))
    figure(samples, args.out.with_suffix(".png"))
    print(summarise(samples, capacity_rps, rate))


if __name__ == "__main__":
    main()
