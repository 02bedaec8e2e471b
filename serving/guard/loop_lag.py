"""The event loop's lag: how late it runs a timer that is due. Every request's bytes
pass through the one loop, so whatever holds it (a slow callback, a long computation,
the GIL held by another thread) is added to each request waiting on it, and shows
here first: the first thing to check when the tail moves while the engine's phases
do not.

A timer every `interval_s` (100 ms) measures how late it fired. A block longer than
the interval is always caught, at its full length; a shorter one with probability
about its length / the interval. Ten samples a second cost well under 1 ms of CPU.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Final

DEFAULT_INTERVAL_S: Final = 0.1
RECENT_S: Final = 60.0  # what `describe()` summarises: the last minute


class LoopLagMonitor:
    """Samples the running loop's lag into `record(seconds)` until `stop()`."""

    __slots__ = ("_record", "interval_s", "_task", "worst_s", "_recent")

    def __init__(self, record: Callable[[float], None], interval_s: float = DEFAULT_INTERVAL_S):
        self._record = record
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None
        self.worst_s = 0.0  # the largest since start
        self._recent: deque[float] = deque(maxlen=max(1, round(RECENT_S / interval_s)))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        interval, clock = self.interval_s, time.monotonic
        while True:
            due = clock() + interval
            await asyncio.sleep(interval)
            lag = max(0.0, clock() - due)
            self._recent.append(lag)
            self.worst_s = max(self.worst_s, lag)
            self._record(lag)

    def describe(self) -> dict:
        """The last minute's samples (p50, p99, max) and the worst since start, in
        seconds: what the console's health line shows."""
        recent = sorted(self._recent)
        if not recent:
            return {"samples": 0, "p50_s": None, "p99_s": None, "max_s": None,
                    "worst_s": self.worst_s, "interval_s": self.interval_s}
        n = len(recent)
        return {"samples": n, "p50_s": recent[(n - 1) // 2],
                "p99_s": recent[min(n - 1, int(0.99 * n))], "max_s": recent[-1],
                "worst_s": self.worst_s, "interval_s": self.interval_s}

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
