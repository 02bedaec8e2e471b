"""Profile the tailguard server process under load with py-spy: where its CPU goes.

Starts `tailguard serve` (every default on, the loose SLO of the vs-vLLM benchmark so
nothing is refused), drives it with vLLM's own benchmark client (a closed loop of
short requests, as `bench/serving/vs_vllm.py` saturates), and records the server
process (not the engine core, a child) with py-spy for `--duration` seconds once the
load runs (`--work light`: vs_vllm's light load, 1 req/s; `--work idle`: none); then
prints the top-N table (`bench/server_cpu/profile_top.py`).

    python -m bench.server_cpu.profile_server --out /tmp/prof.txt --engine-arg=--dtype \
        --engine-arg=float32

Run it in two checkouts (before and after a change) for a before/after table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.server_cpu import profile_top
from bench.serving import vllm_client as C
from bench.serving.vs_vllm import LOOSE_SLO, NAME, TOKEN, _free_port, start
from serving.engine.embedded_model import ensure_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="py-spy raw output")
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--work", choices=("saturate", "light", "idle"), default="saturate",
                    help="a closed loop (default), streamed requests at 1 req/s as "
                         "vs_vllm's light load, or no request at all")
    ap.add_argument("--engine-arg", action="append", default=[])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", action="store_true",
                    help="record each thread apart (py-spy --threads) and print their shares")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db",
               str(Path(tmp) / "trace.duckdb"), "--slo", str(LOOSE_SLO), "--",
               *args.engine_arg]
        server = start(cmd, url, Path(tmp) / "server.log",
                       dict(os.environ, TAILGUARD_ADMIN_TOKEN=TOKEN))
        try:
            # more than the server can finish while recorded (~20-40 req/s here)
            work = {"saturate": C.saturate(args.concurrency, 60 * (args.duration + 10)),
                    "light": C.light(1.0, args.duration + 10), "idle": None}[args.work]
            if work is not None:
                threading.Thread(target=_drive, args=(url, server.pid, work),
                                 daemon=True).start()
            time.sleep(5)  # the loop is full, or the start-up is over
            subprocess.run([py_spy, "record", "--pid", str(server.pid), "--duration",
                            str(args.duration), "--rate", "200", "--format", "raw",
                            "--output", str(args.out), "--nonblocking",
                            *(["--threads"] if args.threads else [])], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            server.terminate()
            server.wait(timeout=60)
    # the client's thread may still hold stdout redirected (its report is swallowed)
    sys.stdout = sys.__stdout__
    sys.argv = ["profile_top", str(args.out), "--top", str(args.top)]
    profile_top.main()
    if args.threads:
        thread_shares(args.out)


def thread_shares(raw: Path) -> None:
    """Samples per thread: the thread frames py-spy `--threads` puts first in a stack."""
    inclusive, _, total = profile_top.parse(raw)
    print("\n| share of samples | thread |\n|---:|---|")
    for thread, n in inclusive.most_common():
        if thread.startswith("thread ("):
            print(f"| {100 * n / max(total, 1):.1f}% | {thread} |")


def _drive(url: str, pid: int, work: C.Workload) -> None:
    try:
        C.run(url, pid, NAME, str(ensure_model()), work, seed=1, prefix="prof-")
    except Exception:  # the server stops under it at the end
        pass


if __name__ == "__main__":
    main()
