"""Function calls and profiled self time per request on the server's event-loop
thread, tailguard against vLLM's own server: where tailguard's extra CPU goes, counted
rather than sampled.

Each server in turn, alone (float32, tcmalloc preloaded, tailguard's policies forced
off), a warm-up, then a closed loop of vLLM's benchmark client (16 clients, 300-token
prompts, 16 output tokens) with cProfile on the server's main thread for exactly
those requests (`main_thread_profiler.py`, between two signals). Call counts are
exact and do not depend on the machine's speed; profiled times are inflated by the
profiler (most for small functions) and only rank where the time goes.

    python -m bench.server_cpu.call_profile [--requests 320] [--top 30]
"""

from __future__ import annotations

import argparse
import os
import pstats
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.serving import vllm_client as C
from bench.serving.vs_vllm import (
    NAME, TOKEN, _free_port, force_policies_off, start, vllm_command)
from serving.engine.allocator import find_tcmalloc
from serving.engine.embedded_model import ensure_model
from serving.engine.setup import cpu_dtype_flags, scheduling_flags

PROFILER = Path(__file__).with_name("main_thread_profiler.py")
ROOT = Path(__file__).resolve().parents[2]
ENGINE_FLAGS = ["--dtype", "float32"]


def profile(side: str, tmp: Path, requests: int) -> Path:
    """Serve `side`, profile `requests` saturated requests; the stats file."""
    model, port = str(ensure_model()), _free_port()
    url, out = f"http://127.0.0.1:{port}", tmp / f"{side}.prof"
    flags = [*ENGINE_FLAGS, *cpu_dtype_flags(ENGINE_FLAGS), *scheduling_flags(ENGINE_FLAGS)]
    # tcmalloc preloaded here, so tailguard does not re-exec itself without the profiler
    # The profiler runs as a script, so the checkout's root (where `bench` lives, the
    # vLLM side's lag probe) is put on the path.
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PROFILE_OUT=str(out),
               LD_PRELOAD=find_tcmalloc(), TAILGUARD_ADMIN_TOKEN=TOKEN,
               PYTHONPATH=str(ROOT))
    if side == "vllm":
        module_args = vllm_command(model, port, flags)[2:]
    else:
        module_args = ["tailguard", "serve", "--port", str(port), "--db",
                       str(tmp / "trace.duckdb"), "--", *flags]
    server = start([sys.executable, str(PROFILER), *module_args], url,
                   tmp / f"{side}.log", env)
    try:
        if side == "tailguard":
            force_policies_off(url)
        C.run(url, server.pid, NAME, model, C.saturate(16, 64), 0, "warmup-")
        os.kill(server.pid, signal.SIGUSR1)
        done = C.run(url, server.pid, NAME, model, C.saturate(16, requests), 1, "prof-")
        os.kill(server.pid, signal.SIGUSR2)
        if done["completed"] != requests:
            sys.exit(f"{side}: {done['completed']} of {requests} requests completed")
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return out


def where(path: str, name: str) -> str:
    """The package a function lives in (tailguard's by module), or the builtin."""
    if path == "~":
        return "builtins"
    path = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", path)
    for ours in ("observe/", "serving/", "slo/", "tailguard/"):
        if ours in path:
            return "tailguard " + path[path.index(ours):].split(".py")[0]
    return path.split("/")[0].removesuffix(".py")


def per_request(stats_file: Path, requests: int) -> tuple[Counter, Counter, dict]:
    """(calls, self seconds) per request by package, and per function."""
    calls, self_s, functions = Counter(), Counter(), {}
    for (path, line, name), (_, count, tottime, _, _) in pstats.Stats(
            str(stats_file)).stats.items():
        key = where(path, name)
        calls[key] += count / requests
        self_s[key] += tottime / requests
        functions[f"{key}:{line}({name})"] = (count / requests, tottime / requests)
    return calls, self_s, functions


def report(sides: dict, top: int) -> None:
    (vc, vs, _), (tc, ts, tf) = sides["vllm"], sides["tailguard"]
    print(f"per request on the event-loop thread: calls vLLM {sum(vc.values()):.0f}, "
          f"tailguard {sum(tc.values()):.0f}; profiled self time vLLM "
          f"{1e3 * sum(vs.values()):.2f} ms, tailguard {1e3 * sum(ts.values()):.2f} ms\n")
    print("| package | calls, vLLM | calls, tailguard | self µs, vLLM | self µs, tailguard |")
    print("|---|---:|---:|---:|---:|")
    for key in sorted(set(vc) | set(tc), key=lambda k: -abs(ts[k] - vs[k]))[:top]:
        print(f"| {key} | {vc[key]:.1f} | {tc[key]:.1f} | {1e6 * vs[key]:.1f} | "
              f"{1e6 * ts[key]:.1f} |")
    print("\ntailguard's own functions by self time:\n")
    print("| function | calls | self µs |")
    print("|---|---:|---:|")
    ours = sorted(((k, v) for k, v in tf.items() if k.startswith("tailguard ")),
                  key=lambda kv: -kv[1][1])
    for key, (count, self_time) in ours[:top]:
        print(f"| {key.removeprefix('tailguard ')} | {count:.1f} | {1e6 * self_time:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=320)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the two stats files (vllm.prof, tailguard.prof) in this "
                         "folder, for pstats")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        sides = {side: per_request(profile(side, folder, args.requests), args.requests)
                 for side in ("vllm", "tailguard")}
    report(sides, args.top)


if __name__ == "__main__":
    main()
