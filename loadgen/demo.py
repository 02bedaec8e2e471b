"""Background load for `tailguard up --demo`: mixed traffic with a burst now and then,
so the console has data within a minute."""

from __future__ import annotations

import asyncio
import logging
import threading

from loadgen.runner import Target, discover, run
from loadgen.workload import Workload

log = logging.getLogger("tailguard.demo")
ROUND_S = 60.0


def start_demo(url: str, rate: float = 2.0) -> threading.Thread:
    thread = threading.Thread(target=_loop, args=(url, rate), name="tailguard-demo", daemon=True)
    thread.start()
    return thread


def _loop(url: str, rate: float) -> None:
    model, context = discover(url)
    target = Target(url, model)
    seed = 0
    while True:
        scenario = "burst" if seed % 4 == 3 else "mixed"
        workload = Workload(scenario, rate, ROUND_S, 10_000, max_context=context,
                            output_tokens=32, seed=seed)
        try:
            asyncio.run(run(target, workload))
        except Exception:  # the demo must never take the server down with it
            log.exception("demo round failed")
        seed += 1
