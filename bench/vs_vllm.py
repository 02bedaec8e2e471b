"""Benchmark: tailguard vs vLLM's own OpenAI server, same model, same engine flags.

Both servers run side by side on loopback (an idle engine waits on its socket and
costs no CPU). vLLM's server starts as its CPU guide recommends: tcmalloc preloaded,
`VLLM_CPU_KVCACHE_SPACE` set; `tailguard serve` preloads tcmalloc itself. Each round,
each side takes, in turn (the side that goes first alternates by round):

- (a) saturation: a closed loop of `--concurrency` clients sending the seeded mixed
  workload back to back for `--saturate-s` seconds: output tokens/s completed;
- (b) light load: the open-loop workload at `--light-rate` req/s (well below capacity)
  for `--light-s` seconds: client-side TTFT and TPOT p50/p99;
- (c) during each: CPU seconds of the server process itself (utime + stime of every
  thread, from /proc/PID/stat; the engine core is a child and not counted) per
  completed request.

A warm-up round (short, both sides) is dropped. Every run prints one line; the report
gives every round and the per-round tailguard/vLLM ratios' median [min-max].

    python bench/vs_vllm.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from serving.allocator import find_tcmalloc
from serving.bench_report import summarize
from serving.loadgen import Target, run, run_closed
from serving.model import ensure_model
from serving.workload import Workload
from slo.spec import load_spec

NAME = "tailguard-tiny-llama"
SIDES = ("vllm", "tailguard")
TOKEN = "vs-vllm-bench-admin-token"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float:
    """utime + stime of every thread of the process (not its children)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def start(cmd: list[str], url: str, log: Path, env: dict) -> subprocess.Popen:
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
    ports = {side: _free_port() for side in SIDES}
    urls = {side: f"http://127.0.0.1:{port}" for side, port in ports.items()}
    base = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    tcmalloc = find_tcmalloc()
    if tcmalloc is None:
        sys.exit("tcmalloc not found (apt-get install libtcmalloc-minimal4): vLLM's CPU guide "
                 "preloads it, and so does tailguard serve")
    vllm_env = dict(base, LD_PRELOAD=tcmalloc)
    tailguard = [sys.executable, "-m", "tailguard", "serve", "--port", str(ports["tailguard"]),
                 "--db", str(tmp / "trace.duckdb")]
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", NAME, "--enforce-eager", "--port", str(ports["vllm"]),
            "--host", "127.0.0.1", "--distributed-executor-backend", "uni",
            "--disable-uvicorn-access-log"]
    return {"vllm": (urls["vllm"], start(vllm, urls["vllm"], tmp / "vllm.log", vllm_env)),
            "tailguard": (urls["tailguard"], start(tailguard, urls["tailguard"], tmp / "tg.log",
                                                   dict(base, TAILGUARD_ADMIN_TOKEN=TOKEN)))}


def measured(url: str, pid: int, spec, coroutine) -> dict:
    cpu = process_cpu_s(pid)
    results = asyncio.run(coroutine)
    cpu = process_cpu_s(pid) - cpu
    summary = summarize(results, spec, {})
    summary["server_cpu_s"] = cpu
    summary["cpu_ms_per_request"] = 1000 * cpu / summary["ok"] if summary["ok"] else None
    return summary


def side_run(url: str, pid: int, spec, args, seed: int, warmup: bool) -> dict:
    target = Target(url, NAME)
    closed = Workload("mixed", 50.0, 10.0 if warmup else args.saturate_s, 100_000,
                      output_tokens=args.output_tokens, seed=seed)
    light = Workload("mixed", args.light_rate, 5.0 if warmup else args.light_s, 100_000,
                     output_tokens=args.output_tokens, seed=seed + 1000)
    return {"saturate": measured(url, pid, spec, run_closed(target, closed, args.concurrency)),
            "light": measured(url, pid, spec, run(target, light))}


def rounds(running, args, spec) -> list[dict]:
    rows = []
    for i in range(args.rounds + 1):  # round 0 warms both up and is dropped
        order = list(SIDES) if i % 2 == 0 else list(reversed(SIDES))
        row = {"round": i, "first": order[0], "loadavg": os.getloadavg()[0]}
        for side in order:
            url, process = running[side]
            row[side] = side_run(url, process.pid, spec, args, seed=i, warmup=i == 0)
            print(json.dumps({"round": i, "side": side, **brief(row[side])}), flush=True)
        if i:
            rows.append(row)
    return rows


def brief(run: dict) -> dict:
    sat, light = run["saturate"], run["light"]
    return {"sat_tok_s": sat["output_tokens_per_s"], "sat_ok": sat["ok"],
            "sat_errors": sat["errors"], "sat_cpu_ms": sat["cpu_ms_per_request"],
            "light_ok": light["ok"], "light_errors": light["errors"],
            "light_cpu_ms": light["cpu_ms_per_request"],
            **{k: light["latency"]["all"][k] for k in
               ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")}}


METRICS = (("(a) output tokens/s, closed loop", "sat_tok_s", 1),
           ("(b) TTFT p50, light load (ms)", "ttft_p50", 1000),
           ("(b) TTFT p99, light load (ms)", "ttft_p99", 1000),
           ("(b) TPOT p50, light load (ms)", "tpot_p50", 1000),
           ("(b) TPOT p99, light load (ms)", "tpot_p99", 1000),
           ("(c) server CPU ms/request, closed loop", "sat_cpu_ms", 1),
           ("(c) server CPU ms/request, light load", "light_cpu_ms", 1))


def report(rows: list[dict], args) -> None:
    briefs = [{side: brief(row[side]) for side in SIDES} for row in rows]
    print(f"\n{len(rows)} rounds; closed loop {args.concurrency} clients x {args.saturate_s:g} s, "
          f"light load {args.light_rate:g} req/s x {args.light_s:g} s, "
          f"{args.output_tokens} output tokens\n")
    print("| round | first | load avg | " + " | ".join(
        f"{key} vLLM / tailguard" for _, key, _ in METRICS) + " |")
    print("|---|---|---|" + "---|" * len(METRICS))
    for row, b in zip(rows, briefs):
        cells = [f"{scale * b['vllm'][key]:.1f} / {scale * b['tailguard'][key]:.1f}"
                 for _, key, scale in METRICS]
        print(f"| {row['round']} | {row['first']} | {row['loadavg']:.2f} | " + " | ".join(cells)
              + " |")
    print("\n| metric | vLLM median | tailguard median | tailguard/vLLM per round: median "
          "[min-max] |\n|---|---:|---:|---:|")
    for label, key, scale in METRICS:
        vllm = [b["vllm"][key] for b in briefs]
        ours = [b["tailguard"][key] for b in briefs]
        ratios = [o / v for o, v in zip(ours, vllm)]
        print(f"| {label} | {scale * statistics.median(vllm):.2f} | "
              f"{scale * statistics.median(ours):.2f} | {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}] |")
    errors = {side: sum(sum(b[side]["sat_errors"].values()) + sum(b[side]["light_errors"].values())
                        for b in briefs) for side in SIDES}
    print(f"\nfailed requests: {errors}")
    print("command: python bench/vs_vllm.py " + " ".join(sys.argv[1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--saturate-s", type=float, default=30.0)
    ap.add_argument("--light-rate", type=float, default=1.5)
    ap.add_argument("--light-s", type=float, default=40.0)
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


if __name__ == "__main__":
    main()
