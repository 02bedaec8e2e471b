"""The concurrency limit in front of the engine, with two lanes.

A request holds a slot from admission until its engine request ends. When all slots
are taken, arrivals wait in their lane: realtime before batch, first come first
served within a lane. The limit can change at any time (the policies move it);
lowering it never interrupts requests that already hold a slot.
"""

from __future__ import annotations

import asyncio
from collections import deque

from observe import registry as R


class LimiterTimeout(Exception):
    """A request waited longer than the limiter allows."""


class Limiter:
    def __init__(self, limit: int, max_wait_s: float = 120.0):
        self._limit = max(1, limit)
        self.max_wait_s = max_wait_s
        self.in_flight = 0
        self._lanes: dict[str, deque[asyncio.Future]] = {p: deque() for p in R.PRIORITIES}

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit = max(1, int(value))
        self._wake()

    @property
    def waiting(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    async def acquire(self, lane: str, timeout_s: float | None = None) -> None:
        """Take a slot, waiting at most `timeout_s` (and never past `max_wait_s`)."""
        if self.in_flight < self._limit and not self.waiting:
            self.in_flight += 1
            return
        wait = self.max_wait_s if timeout_s is None else min(timeout_s, self.max_wait_s)
        waiter = asyncio.get_running_loop().create_future()
        self._lanes[lane].append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot came just as we gave up: pass it on
            else:
                waiter.cancel()
                self._lanes[lane].remove(waiter)
            if isinstance(exc, asyncio.TimeoutError):
                raise LimiterTimeout(f"waited {wait:g} s for an engine slot")
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        for lane in R.PRIORITIES:  # realtime first
            queue = self._lanes[lane]
            while queue and self.in_flight < self._limit:
                waiter = queue.popleft()
                if not waiter.done():
                    self.in_flight += 1
                    waiter.set_result(None)
