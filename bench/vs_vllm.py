"""Benchmark: tailguard vs vLLM's own OpenAI server, same model, same workload.

Both servers run side by side on loopback (one engine each; an idle engine waits on
its socket and costs no CPU), and the same seeded open-loop workload is sent to one,
then the other, alternating the order each round. Reported per side: throughput
(requests/s and output tokens/s) and client-side TTFT/TPOT/e2e percentiles, plus the
per-round tailguard/vLLM throughput ratio with its spread.

    python bench/vs_vllm.py --rounds 4 --rate 4 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from serving.bench_report import summarize
from serving.loadgen import Target, run
from serving.model import ensure_model
from serving.workload import Workload
from slo.spec import load_spec

NAME = "tailguard-tiny-llama"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               TAILGUARD_ADMIN_TOKEN="bench")
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{cmd[:4]} exited; see {log}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return process
        except OSError:
            time.sleep(1)
    sys.exit(f"not ready: {log}")


def servers(tmp: Path) -> dict[str, tuple[str, subprocess.Popen]]:
    model = str(ensure_model())
    ports = {"tailguard": _free_port(), "vllm": _free_port()}
    urls = {k: f"http://127.0.0.1:{p}" for k, p in ports.items()}
    tailguard = [sys.executable, "-m", "tailguard", "serve", "--port", str(ports["tailguard"]),
                 "--db", str(tmp / "trace.duckdb")]
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", NAME, "--enforce-eager", "--port", str(ports["vllm"]),
            "--host", "127.0.0.1", "--distributed-executor-backend", "uni",
            "--disable-uvicorn-access-log"]
    return {"tailguard": (urls["tailguard"], start(tailguard, urls["tailguard"], tmp / "tg.log")),
            "vllm": (urls["vllm"], start(vllm, urls["vllm"], tmp / "vllm.log"))}


def one_round(url: str, workload: Workload, spec) -> dict:
    results = asyncio.run(run(Target(url, NAME), workload))
    return summarize(results, spec, {})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--scenario", default="mixed")
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    spec = load_spec()
    with tempfile.TemporaryDirectory() as tmp:
        running = servers(Path(tmp))
        try:
            rows = rounds(running, args, spec)
        finally:
            for _, process in running.values():
                process.terminate()
                process.wait(timeout=60)
    report(rows, args)


def rounds(running, args, spec) -> list[dict]:
    rows = []
    for i in range(args.rounds + 1):  # round 0 warms both up and is dropped
        workload = Workload(args.scenario, args.rate, args.duration, 100_000,
                            output_tokens=args.output_tokens, seed=i)
        order = ["tailguard", "vllm"] if i % 2 else ["vllm", "tailguard"]
        row = {side: one_round(running[side][0], workload, spec) for side in order}
        if i:
            rows.append(row)
        print(f"round {i}: " + ", ".join(
            f"{s} {row[s]['output_tokens_per_s']:.1f} tok/s" for s in order), flush=True)
    return rows


def report(rows: list[dict], args) -> None:
    def med(side, key, sub=None):
        values = [(r[side]["latency"]["all"][sub] if sub else r[side][key]) for r in rows]
        return statistics.median(values)

    ratios = [r["tailguard"]["output_tokens_per_s"] / r["vllm"]["output_tokens_per_s"]
              for r in rows]
    print(f"\n{args.scenario} at {args.rate} req/s x {args.duration:g} s, {args.rounds} rounds "
          "(medians over rounds)\n")
    print("| metric | vLLM server | tailguard | tailguard/vLLM |\n|---|---|---|---|")
    for label, key in (("throughput (req/s)", "throughput_rps"),
                       ("output tokens/s", "output_tokens_per_s")):
        a, b = med("vllm", key), med("tailguard", key)
        print(f"| {label} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
    for sub in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p99"):
        a, b = med("vllm", None, sub), med("tailguard", None, sub)
        print(f"| {sub} (ms) | {1000 * a:.1f} | {1000 * b:.1f} | {b / a:.3f} |")
    print(f"\nper-round tokens/s ratio: median {statistics.median(ratios):.3f}, "
          f"min {min(ratios):.3f}, max {max(ratios):.3f}")
    print("command: python bench/vs_vllm.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
