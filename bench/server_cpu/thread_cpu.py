"""Where a server's CPU goes, thread by thread: one server alone on the machine (no
second server beside it, unlike `vs_vllm`), a warm-up, then one workload through vLLM's
own benchmark client, with each thread's utime + stime from /proc/PID/task read
before and after and named by `py-spy dump` (Python does not name OS threads).

    python -m bench.server_cpu.thread_cpu --side tailguard --work saturate
    python -m bench.server_cpu.thread_cpu --side vllm --work light

`--work idle` reads 30 s of an idle server (CPU ms per second, not per request).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.serving import vllm_client as C
from bench.serving.vs_vllm import (
    NAME,
    TOKEN,
    _free_port,
    force_policies_off,
    settle,
    start,
    vllm_command,
)
from serving.engine.allocator import find_tcmalloc
from serving.engine.embedded_model import ensure_model
from serving.engine.setup import scheduling_flags

WORKLOADS = {"light": (C.light(4.0, 8), C.light(1.0, 40)),
             "saturate": (C.saturate(16, 48), C.saturate(16, 320))}


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of `pid` (a thread gone since is not listed)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = C.stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
        except OSError:
            continue
    return out


def thread_names(pid: int) -> dict[int, str]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid), "--nonblocking"],
                          capture_output=True, text=True).stdout
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r'^Thread (\d+) \(\w+\): "([^"]*)"', dump, re.M)}


def command(side: str, port: int, tmp: str) -> tuple[list[str], dict]:
    model = str(ensure_model())
    if side == "vllm":
        return (vllm_command(model, port, ["--dtype", "float32", *scheduling_flags([])]),
                dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", LD_PRELOAD=find_tcmalloc() or ""))
    return ([sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db",
             f"{tmp}/trace.duckdb", "--", "--dtype", "float32"],
            dict(os.environ, TAILGUARD_ADMIN_TOKEN=TOKEN, VLLM_CPU_KVCACHE_SPACE="1"))


def measure(side: str, work: str) -> tuple[dict[int, float], float, int]:
    """(CPU seconds per thread over the run, the process's, requests completed)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd, env = command(side, port, tmp)
        server = start(cmd, url, Path(tmp) / "server.log", env)
        try:
            if side == "tailguard":
                force_policies_off(url)  # as vs_vllm: their thresholds are not the server
            model = str(ensure_model())
            warm, run = WORKLOADS.get(work, WORKLOADS["light"])
            C.run(url, server.pid, NAME, model, warm, 0, "warm-")
            before, process = thread_cpu(server.pid), C.process_cpu_s(server.pid)
            if work == "idle":
                time.sleep(30)
                completed = 30
            else:
                completed = C.run(url, server.pid, NAME, model, run, 1, "run-",
                                  settle(url) if side == "tailguard" else None)["completed"]
            after = thread_cpu(server.pid)
            process = C.process_cpu_s(server.pid) - process
            names = thread_names(server.pid)
        finally:
            server.terminate()
            server.wait()
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    return {names.get(tid, f"native {tid}"): s for tid, s in spent.items() if s > 0}, \
        process, completed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("tailguard", "vllm"), default="tailguard")
    ap.add_argument("--work", choices=("light", "saturate", "idle"), default="saturate")
    args = ap.parse_args()
    spent, process, completed = measure(args.side, args.work)
    unit = "ms of CPU a second" if args.work == "idle" else "ms of CPU a request"
    print(f"{args.side}, {args.work}: {1000 * process / completed:.2f} {unit} "
          f"(the process; {completed} {'s' if args.work == 'idle' else 'requests'})")
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {1000 * seconds / completed:8.2f}  {name}")


if __name__ == "__main__":
    main()
