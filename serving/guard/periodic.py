"""A background job run every `interval_s` seconds on a daemon thread (model
retraining, forecaster re-selection): off the event loop, stopped with the server."""

from __future__ import annotations

import threading
from typing import Callable


class Periodic:
    def __init__(self, name: str, interval_s: float, job: Callable[[], object]):
        self.name, self.interval_s, self.job = name, interval_s, job
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the thread; an interval of 0 means never."""
        if self.interval_s > 0:
            threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.job()

    def stop(self) -> None:
        self._stop.set()
