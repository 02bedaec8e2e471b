"""Two checkouts of tailguard side by side: server CPU per request (light load and
saturation), idle CPU and saturated tokens/s, rounds alternating which goes first.

What a change did to the server's cost, measured the way `vs_vllm` measures the gap to
vLLM (vLLM's own benchmark client, the server process's utime + stime from /proc),
with the degradation policies forced off on both. Make the older checkout with
`git worktree add /tmp/base REV`; both run with this checkout's virtual environment.

    python -m bench.server_cpu.ab_checkouts /tmp/base . --rounds 5
    python -m bench.server_cpu.ab_checkouts /tmp/base . --idle-only --idle-s 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.serving import vllm_client as C
from bench.serving.vs_vllm import NAME, TOKEN, _free_port, force_policies_off, settle, start
from serving.engine.embedded_model import ensure_model

SIDES = ("A", "B")
IDLE_S = 10


def serve(checkout: Path, tmp: Path, policies_off: bool = True,
          extra_env: dict[str, str] | None = None):
    """`tailguard serve` from `checkout`'s packages (float32, its own trace log), ready;
    (url, process). `policies_off`: every degradation policy forced off, as a cost
    comparison needs; `extra_env`: settings for this server."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db",
           str(tmp / "trace.duckdb"), "--", "--dtype", "float32"]
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=TOKEN, PYTHONPATH=str(checkout),
               VLLM_CPU_KVCACHE_SPACE="1", **(extra_env or {}))
    here = os.getcwd()
    os.chdir(checkout)  # `python -m tailguard` imports the checkout's packages
    try:
        server = start(cmd, url, tmp / "server.log", env)
    finally:
        os.chdir(here)
    if policies_off:
        force_policies_off(url)
    return url, server


def one_round(url: str, pid: int, seed: int, tag: str, idle_s: float = IDLE_S,
              idle_only: bool = False) -> dict:
    model = str(ensure_model())
    cpu = C.process_cpu_s(pid)
    time.sleep(idle_s)
    out = {"idle": 1000 * (C.process_cpu_s(pid) - cpu) / idle_s}
    if idle_only:
        return out
    out["light"] = C.run(url, pid, NAME, model, C.light(1.0, 30), seed, f"{tag}l-",
                         settle(url))["cpu_ms"]
    sat = C.run(url, pid, NAME, model, C.saturate(16, 160), seed, f"{tag}s-", settle(url))
    out["saturate"], out["tok_s"] = sat["cpu_ms"], sat["output_tok_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a", type=Path, help="checkout A (the baseline)")
    ap.add_argument("b", type=Path, help="checkout B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--idle-only", action="store_true",
                    help="measure only the idle CPU, over --idle-s a round")
    ap.add_argument("--idle-s", type=float, default=IDLE_S)
    args = ap.parse_args()
    model = str(ensure_model())
    with tempfile.TemporaryDirectory() as tmp:
        running = {}
        try:
            for side, checkout in zip(SIDES, (args.a, args.b)):
                (Path(tmp) / side).mkdir()
                running[side] = serve(checkout.resolve(), Path(tmp) / side)
            for url, server in running.values():  # warm-up, dropped
                C.run(url, server.pid, NAME, model, C.light(4.0, 8), 0, "warm-")
                C.run(url, server.pid, NAME, model, C.saturate(16, 32), 0, "warmsat-")
            rows = {side: [] for side in SIDES}
            for r in range(args.rounds):
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    url, server = running[side]
                    rows[side].append(one_round(url, server.pid, r + 1, f"r{r + 1}",
                                                args.idle_s, args.idle_only))
                    print({"round": r + 1, "side": side, **rows[side][-1]}, flush=True)
        finally:
            for _, server in running.values():
                server.terminate()
                server.wait()
    report(rows)


def report(rows: dict[str, list[dict]]) -> None:
    keys = [key for key in ("idle", "light", "saturate", "tok_s") if key in rows["A"][0]]
    print("\n| measure | A median | B median | B/A per round: median [min-max] |")
    print("|---|---:|---:|---:|")
    for key, label in (("idle", "idle CPU, ms a second"),
                       ("light", "CPU ms per request, light (1 req/s)"),
                       ("saturate", "CPU ms per request, saturation (16 clients)"),
                       ("tok_s", "output tokens/s, saturation")):
        if key not in keys:
            continue
        a, b = [r[key] for r in rows["A"]], [r[key] for r in rows["B"]]
        ratios = [y / x for x, y in zip(a, b) if x]
        print(f"| {label} | {statistics.median(a):.2f} | {statistics.median(b):.2f} | "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] |")


if __name__ == "__main__":
    main()
