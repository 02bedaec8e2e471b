"""The engine's load as the server sees it, live: what admission decisions and the
latency predictor read when a request arrives.

The engine's own counts (waiting, running, KV-cache usage) arrive with each step
through the stat logger; the server's counts (requests admitted that have no first
token yet, and their prompt tokens) change with every request, so a burst is visible
before the engine has taken a single step of it.
"""

from __future__ import annotations

import os
import threading

from observe.record import AdmissionLoad
from observe.stats import StepRecord
from serving.engine.stats import EngineSecond

STEP_EWMA_ALPHA = 0.2  # weight of the newest step: about the last ten steps matter


class LoadTracker:
    def __init__(self, second: EngineSecond):
        self._second = second
        self._lock = threading.Lock()
        self._pending = 0
        self._pending_tokens = 0
        self.recent_step_s = 0.0

    def on_step(self, step: StepRecord) -> None:
        """Ledger consumer (its own thread): a moving average of step time."""
        alpha = STEP_EWMA_ALPHA if self.recent_step_s else 1.0
        self.recent_step_s += alpha * (step.duration_s - self.recent_step_s)

    def admit(self, prompt_tokens: int) -> AdmissionLoad:
        """The load just before this request joins it; it is pending from now on."""
        second = self._second
        with self._lock:
            load = AdmissionLoad(second.waiting, second.running, second.kv_cache_usage,
                                 self.recent_step_s, self._pending, self._pending_tokens)
            self._pending += 1
            self._pending_tokens += prompt_tokens
        return load

    def release(self, prompt_tokens: int) -> None:
        """The request's prefill is done (or it left): no longer work ahead of newcomers."""
        with self._lock:
            self._pending -= 1
            self._pending_tokens -= prompt_tokens

    @property
    def pending(self) -> tuple[int, int]:
        return self._pending, self._pending_tokens


def resident_bytes(pid: int | None = None) -> int | None:
    """RSS of a process and its children (the engine core runs in a child)."""
    try:
        import psutil

        proc = psutil.Process(pid or os.getpid())
        procs = [proc, *proc.children(recursive=True)]
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue  # a child that just exited
        return total
    except (ImportError, OSError):
        return None
