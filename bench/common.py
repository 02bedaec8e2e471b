"""What more than one benchmark needs: where the repository is, the command line that
reproduces a run, and a tailguard server started on a port and waited for.

Benchmarks run from the repository root as modules (`python -m bench.serving.overhead`),
so `bench`, the product packages and `tests` all import without path set-up.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tailguard.launcher import wait_ready

REPO_ROOT = Path(__file__).resolve().parents[1]


def command_line(module: str) -> str:
    """`python -m <module> <this run's arguments>`: printed with the results, so a
    reader can run the same measurement again."""
    return shlex.join(["python", "-m", module, *sys.argv[1:]])


def start_tailguard(port: int, serve_args: list[str], log: Path, env: dict | None = None,
                    **popen) -> subprocess.Popen:
    """`tailguard serve --port PORT *serve_args` in a child process, its output in `log`;
    returns once the server answers /readyz (LaunchError if it dies first)."""
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), *serve_args]
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                               **popen)
    wait_ready(f"http://127.0.0.1:{port}", process, log)
    return process
