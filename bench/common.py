"""What more than one benchmark needs: where the repository is, the command line that
reproduces a run, the machine it ran on, and a tailguard server started on a port and
waited for.

Benchmarks run from the repository root as modules (`python -m bench.serving.overhead`),
so `bench`, the product packages and `tests` all import without path set-up.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tailguard.launcher import refuse_taken_port, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[1]


def command_line(module: str) -> str:
    """`python -m <module> <this run's arguments>`: printed with the results, so a
    reader can run the same measurement again."""
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


def machine() -> str:
    """The CPU model, its vCPUs and the vector extensions vLLM's CPU backend cares
    about: a rate chosen on one machine can be far over capacity on another (the same
    surge bench at 4 req/s served 5 requests/s on time on an AVX-512 EPYC and 0.1 on an
    AVX2 one, where a 2,048-token step took 1.0 s), so every figure names it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{os.cpu_count()} vCPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    vector = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
                       if f in flags) or "no AVX2"
    return f"{model}, {os.cpu_count()} vCPU, {vector}"


def start_tailguard(port: int, serve_args: list[str], log: Path, env: dict | None = None,
                    **popen) -> subprocess.Popen:
    """`tailguard serve --port PORT *serve_args` in a child process, its output in `log`;
    returns once the server answers /readyz (LaunchError if it dies first, or if
    something already listens on the port)."""
    refuse_taken_port("127.0.0.1", port)
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), *serve_args]
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                               **popen)
    wait_ready(f"http://127.0.0.1:{port}", process, log)
    return process
