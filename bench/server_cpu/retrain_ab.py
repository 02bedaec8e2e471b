"""What a latency-model fit costs serving, two checkouts A/B, rounds alternating.

Each round starts one `tailguard serve` from each checkout in turn (alone, policies
forced off, scheduled and drift retrains off), and drives closed-loop batches of 320
short requests (vLLM's benchmark client, 16 clients): a first run of `--rows`
requests gives the model its training rows (a fit's cost grows with them: about 6 s of
a core for ten minutes of saturated traffic); after one batch without a fit, an admin
retrain (which always fits) is asked for, batches go on until it has answered, and two
batches without a fit follow. Per batch: the
server process's CPU a request, output tokens/s, TTFT p99, and whether a fit ran
during it. Per server: the fit's wall time (the admin call) and the CPU of the
processes the server reaped (a fit made in a child process lands there).

    python -m bench.server_cpu.retrain_ab /tmp/A /tmp/B --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.server_cpu.ab_checkouts import SIDES, serve
from bench.serving import vllm_client as C
from bench.serving.vs_vllm import NAME, TOKEN
from serving.engine.embedded_model import ensure_model

BATCH = 320
MAX_FIT_BATCHES = 12


def retrain_in_background(url: str) -> dict:
    """Ask for a latency retrain on a thread; the dict gets `wall_s` and `answer`."""
    out: dict = {}

    def call() -> None:
        started = time.monotonic()
        request = urllib.request.Request(url + "/admin/models/latency/retrain", b"",
                                         method="POST",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=900) as resp:
            out["answer"] = json.loads(resp.read())
        out["wall_s"] = time.monotonic() - started

    out["thread"] = threading.Thread(target=call, daemon=True)
    out["thread"].start()
    return out


def batch(url: str, pid: int, model: str, seed: int, tag: str, fitting: bool) -> dict:
    cpu = C.process_cpu_s(pid)
    result = C.run(url, pid, NAME, model, C.saturate(16, BATCH), seed, tag)
    spent = C.process_cpu_s(pid) - cpu
    return {"fit": fitting, "cpu_ms": 1000 * spent / result["completed"],
            "tok_s": result["output_tok_s"], "ttft_p99": result["ttft_99"],
            "failed": result["failed"]}


def one_server(checkout: Path, tmp: Path, seed: int, rows: int) -> dict:
    url, server = serve(checkout, tmp, extra_env={"TAILGUARD_RETRAIN_S": "0"})
    model = str(ensure_model())
    try:
        children = C.children_cpu_s(server.pid)
        C.run(url, server.pid, NAME, model, C.saturate(16, rows), seed, "rows-")
        batches = [batch(url, server.pid, model, seed + 97, "b0-", False)]
        fit = retrain_in_background(url)
        for i in range(1, MAX_FIT_BATCHES + 1):
            batches.append(batch(url, server.pid, model, seed + i, f"b{i}-", True))
            if not fit["thread"].is_alive():
                break
        fit["thread"].join()
        batches.append(batch(url, server.pid, model, seed + 99, "bz-", False))
        batches.append(batch(url, server.pid, model, seed + 98, "by-", False))
        return {"batches": batches, "fit_wall_s": fit["wall_s"],
                "trained": fit["answer"].get("trained"),
                "children_cpu_s": C.children_cpu_s(server.pid) - children}
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path, help="checkout A (the baseline)")
    ap.add_argument("b", type=Path, help="checkout B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=2560,
                    help="requests served before the fit: its training rows")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                where = Path(tmp) / f"{side}{r}"
                where.mkdir()
                checkout = (args.a if side == "A" else args.b).resolve()
                runs[side].append(one_server(checkout, where, 1000 * (r + 1), args.rows))
                print(json.dumps({"round": r + 1, "side": side, **runs[side][-1]}), flush=True)
    report(runs)


def _pooled(run: dict, fitting: bool, key: str) -> float:
    values = [b[key] for b in run["batches"] if b["fit"] == fitting]
    return statistics.median(values) if values else float("nan")


def report(runs: dict[str, list[dict]]) -> None:
    print("\n| measure | A per round | B per round | B/A of medians |")
    print("|---|---|---|---:|")
    rows = [(f"{label}, batches {'with' if fitting else 'without'} a fit",
             lambda run, f=fitting, k=key: _pooled(run, f, k))
            for fitting in (True, False)
            for key, label in (("cpu_ms", "server CPU ms a request"),
                               ("tok_s", "output tokens/s"), ("ttft_p99", "TTFT p99 s"))]
    rows += [("fit wall time s", lambda run: run["fit_wall_s"]),
             ("batches the fit spanned", lambda run: sum(b["fit"] for b in run["batches"])),
             ("reaped children CPU s", lambda run: run["children_cpu_s"])]
    for label, value in rows:
        a, b = [value(run) for run in runs["A"]], [value(run) for run in runs["B"]]
        ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else 0
        print(f"| {label} | {', '.join(f'{x:.2f}' for x in a)} | "
              f"{', '.join(f'{x:.2f}' for x in b)} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
