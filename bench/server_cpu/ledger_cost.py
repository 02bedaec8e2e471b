"""Benchmark: the step ledger's CPU per engine step (issue 20).

A `StepLedger` receives step datagrams from another process, as the engine's step
probe sends them (16 requests a step, 60 steps a second, 1,200 steps), while a Python
thread spins beside it as a saturated event loop would (the ledger's thread must take
the GIL from it for every step). `full` runs the server's five consumers on every step
(the `llm.step` row, the engine second, the batch-size histogram, the step-time
average, the live engine model); `bare` runs none, leaving the wake-up, the receive
and the decode. The ledger thread's CPU (/proc, by its native id) per step received;
the two alternate, order reversed every other round. Nothing else drains here, so the
thread runs the consumers the server runs as a step is drained too.

    python -m bench.server_cpu.ledger_cost --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from prometheus_client import CollectorRegistry

from observe.metrics import RequestMetrics, create_prometheus_export
from observe.span_rows import RowSpans
from observe.stats import WallClock
from observe.tracelog import TraceLog
from serving.engine.live_model import LiveEngineModel
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.engine.step_receiver import StepLedger

STEPS, RATE, BATCH = 1200, 60.0, 16
SENDER = """
import json, socket, sys, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
ids = ["req-%d-abcdefgh" % i for i in range({batch})]
for index in range({steps}):
    step = [index + 1, time.monotonic(), 0.01, 0.001, {batch}, ids, [], [], 5000]
    sock.sendto(json.dumps(step).encode(), sys.argv[1])
    time.sleep({pause})
"""


def thread_cpu_s(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def consumers(log: TraceLog) -> list:
    metrics = RequestMetrics(create_prometheus_export(CollectorRegistry()).provider
                             .get_meter("bench"))
    spans = RowSpans(lambda row: log.add("spans", row), WallClock())
    second = EngineSecond()
    return [spans.step, second.on_step, lambda step: metrics.record_step(len(step.request_ids))], \
        [LoadTracker(second).on_step, LiveEngineModel().on_step]


def one_run(full: bool) -> float:
    """The ledger thread's CPU ms per step."""
    log = TraceLog(":memory:")
    later, at_once = consumers(log) if full else ([], [])
    ledger = StepLedger(later, at_once=at_once).start()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    threading.Thread(target=spin, daemon=True).start()
    code = SENDER.format(batch=BATCH, steps=STEPS, pause=1 / RATE)
    sender = subprocess.Popen([sys.executable, "-c", code, ledger.path])
    time.sleep(0.5)
    before = thread_cpu_s(ledger._thread.native_id)
    sender.wait()
    time.sleep(0.5)
    used = thread_cpu_s(ledger._thread.native_id) - before
    stop.set()
    seen = ledger.steps_seen
    ledger.close()
    log.close()
    return used / max(seen, 1) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    results: dict[str, list[float]] = {"full": [], "bare": []}
    for rnd in range(args.rounds):
        for side in ("full", "bare") if rnd % 2 == 0 else ("bare", "full"):
            results[side].append(one_run(side == "full"))
        print(f"round {rnd + 1}: full {results['full'][-1]:.3f} ms/step, "
              f"bare {results['bare'][-1]:.3f} ms/step", flush=True)
    for side, values in results.items():
        print(f"{side}: median {statistics.median(values):.3f} ms/step "
              f"[{min(values):.3f}-{max(values):.3f}]")


if __name__ == "__main__":
    main()
