"""Benchmark: tailguard vs vLLM's own OpenAI server, same model, same engine flags.

Both servers run side by side on loopback (an idle engine waits on its socket and
costs no CPU). tailguard's degradation policies and batch-size controller are forced
off through its admin API (`--policies auto` leaves its defaults, which shed under a
closed loop: that is the surge benchmark's subject, not the serving path's cost).
vLLM's server starts as its CPU guide recommends: tcmalloc preloaded,
`VLLM_CPU_KVCACHE_SPACE` set; `tailguard serve` preloads tcmalloc itself. Each round,
each side takes, in turn (the side that goes first alternates by round):

- (b) light load: the open-loop workload at `--light-rate` req/s (well below capacity)
  for `--light-s` seconds: client-side TTFT and TPOT p50/p99 (every light-load round
  runs before the first saturation round);
- (a) saturation: a closed loop of `--concurrency` clients sending the seeded mixed
  workload back to back for `--saturate-s` seconds: output tokens/s completed;
- (c) during each: CPU seconds of the server process itself (utime + stime of every
  thread, from /proc/PID/stat; the engine core is a child and not counted) per
  completed request.

A warm-up round (short, both sides) is dropped. Every run prints one line; the report
gives every round and the per-round tailguard/vLLM ratios' median [min-max].

    python -m bench.serving.vs_vllm --rounds 5
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

from bench.common import command_line
from loadgen.report import summarize
from loadgen.runner import Target, run, run_closed
from loadgen.workload import Workload
from serving.engine.allocator import find_tcmalloc
from serving.engine.embedded_model import ensure_model
from slo.loading import load_spec

NAME = "tailguard-tiny-llama"
SIDES = ("vllm", "tailguard")
PHASES = ("light", "saturate")
POLICIES = ("breaker_l1", "breaker_l2", "token_cap", "vip_only", "memory_pressure",
            "truncation", "predicted_miss", "batch_control")
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


def force_policies_off(url: str) -> None:
    for name in POLICIES:
        body = json.dumps({"mode": "force_off", "reason": "vs_vllm benchmark"}).encode()
        request = urllib.request.Request(
            f"{url}/admin/policies/{name}", body, method="PUT",
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30):
            pass


def measured(pid: int, spec, coroutine) -> dict:
    cpu = process_cpu_s(pid)
    results = asyncio.run(coroutine)
    cpu = process_cpu_s(pid) - cpu
    summary = summarize(results, spec, {})
    summary["server_cpu_s"] = cpu
    summary["cpu_ms_per_request"] = 1000 * cpu / summary["ok"] if summary["ok"] else None
    return summary


def phase_run(phase: str, url: str, pid: int, spec, args, seed: int, warmup: bool) -> dict:
    target = Target(url, NAME)
    if phase == "saturate":
        pool = Workload("mixed", 50.0, 10.0 if warmup else args.saturate_s, 100_000,
                        output_tokens=args.output_tokens, seed=seed)
        return measured(pid, spec, run_closed(target, pool, args.concurrency))
    light = Workload("mixed", args.light_rate, 5.0 if warmup else args.light_s, 100_000,
                     output_tokens=args.output_tokens, seed=seed + 1000)
    return measured(pid, spec, run(target, light))


def rounds(running, args, spec) -> list[dict]:
    """A warm-up of both phases on both sides (dropped); then every light-load round,
    then every saturation round, so no light-load run follows a saturated one."""
    for side in SIDES:
        url, process = running[side]
        for phase in PHASES:
            phase_run(phase, url, process.pid, spec, args, seed=0, warmup=True)
    rows = [{"round": i, "first": SIDES[(i + 1) % 2], "vllm": {}, "tailguard": {}}
            for i in range(1, args.rounds + 1)]
    for phase in PHASES:
        for row in rows:
            row[f"loadavg_{phase}"] = os.getloadavg()[0]
            order = SIDES if row["first"] == SIDES[0] else SIDES[::-1]
            for side in order:
                url, process = running[side]
                row[side][phase] = phase_run(phase, url, process.pid, spec, args,
                                             seed=row["round"], warmup=False)
                print(json.dumps({"round": row["round"], "phase": phase, "side": side,
                                  **brief(row[side], phase)}), flush=True)
    return rows


def brief(run: dict, only: str | None = None) -> dict:
    out = {}
    if only in (None, "saturate"):
        sat = run["saturate"]
        out.update(sat_tok_s=sat["output_tokens_per_s"], sat_ok=sat["ok"],
                   sat_errors=sat["errors"], sat_cpu_ms=sat["cpu_ms_per_request"])
    if only in (None, "light"):
        light = run["light"]
        out.update(light_ok=light["ok"], light_errors=light["errors"],
                   light_cpu_ms=light["cpu_ms_per_request"],
                   **{k: light["latency"]["all"][k] for k in
                      ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")})
    return out


METRICS = (("(a) output tokens/s, closed loop", "sat_tok_s", 1),
           ("(b) TTFT p50, light load (ms)", "ttft_p50", 1000),
           ("(b) TTFT p99, light load (ms)", "ttft_p99", 1000),
           ("(b) TPOT p50, light load (ms)", "tpot_p50", 1000),
           ("(b) TPOT p99, light load (ms)", "tpot_p99", 1000),
           ("(c) server CPU ms/request, closed loop", "sat_cpu_ms", 1),
           ("(c) server CPU ms/request, light load", "light_cpu_ms", 1))


def report(rows: list[dict], args) -> None:
    briefs = [{side: brief(row[side]) for side in SIDES} for row in rows]
    print(f"\ntailguard policies: {args.policies}; {len(rows)} rounds; closed loop {args.concurrency} clients x {args.saturate_s:g} s, "
          f"light load {args.light_rate:g} req/s x {args.light_s:g} s, "
          f"{args.output_tokens} output tokens\n")
    print("| round | first | load avg (light, saturate) | " + " | ".join(
        f"{key} vLLM / tailguard" for _, key, _ in METRICS) + " |")
    print("|---|---|---|" + "---|" * len(METRICS))
    for row, b in zip(rows, briefs):
        cells = [f"{scale * b['vllm'][key]:.1f} / {scale * b['tailguard'][key]:.1f}"
                 for _, key, scale in METRICS]
        print(f"| {row['round']} | {row['first']} | {row['loadavg_light']:.2f}, "
              f"{row['loadavg_saturate']:.2f} | " + " | ".join(cells)
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
    print("command: " + command_line(__spec__.name))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--saturate-s", type=float, default=30.0)
    ap.add_argument("--light-rate", type=float, default=1.5)
    ap.add_argument("--light-s", type=float, default=40.0)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--policies", choices=("off", "auto"), default="off",
                    help="tailguard's degradation policies and batch-size controller: "
                         "forced off (compare the serving path) or left on (its defaults)")
    args = ap.parse_args()
    spec = load_spec()
    with tempfile.TemporaryDirectory() as tmp:
        running = servers(Path(tmp))
        try:
            if args.policies == "off":
                force_policies_off(running["tailguard"][0])
            rows = rounds(running, args, spec)
        finally:
            for _, process in running.values():
                process.terminate()
                process.wait(timeout=60)
    report(rows, args)


if __name__ == "__main__":
    main()
