"""The concurrency limit in front of the engine, with three lanes.

A request holds a slot from admission until its engine request ends. When all slots
are taken, arrivals wait in their lane: VIP, then realtime, then batch, first come
first served within a lane. The limit can change at any time (the policies move it);
lowering it never interrupts requests that already hold a slot.

For the deadline check it also knows what waits in each lane (requests and their
prompt tokens) and how fast slots free up (releases per second, recent), so it can
say how long a newcomer in a lane would wait for a slot.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

from observe import registry as R

LANE_VIP: Final = "vip"
LANES: Final = (LANE_VIP, *R.PRIORITIES)  # the order slots are handed out in
RELEASE_WINDOW_S = 10.0


class LimiterTimeout(Exception):
    """A request waited longer than the limiter allows."""


class Limiter:
    def __init__(self, limit: int, max_wait_s: float = 120.0):
        self._limit = max(1, limit)
        self.max_wait_s = max_wait_s
        self.in_flight = 0
        self._lanes: dict[str, deque[asyncio.Future]] = {lane: deque() for lane in LANES}
        self._lane_tokens = dict.fromkeys(LANES, 0)
        self._releases: deque[float] = deque()

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

    def waiting_tokens(self, through_lane: str | None = None) -> int:
        """Prompt tokens waiting for a slot in `through_lane` and the lanes before it
        (all lanes when None)."""
        end = len(LANES) if through_lane is None else LANES.index(through_lane) + 1
        return sum(self._lane_tokens[lane] for lane in LANES[:end])

    def slot_wait_s(self, lane: str, now: float | None = None) -> float:
        """Expected wait for a slot for a newcomer in `lane`: none while a slot is free
        and nobody ahead waits; else one release per request ahead (and itself), at
        the recent release rate (infinite when nothing has been released lately)."""
        end = LANES.index(lane) + 1
        ahead = sum(len(self._lanes[name]) for name in LANES[:end])
        if self.in_flight < self._limit and not ahead:
            return 0.0
        now = time.monotonic() if now is None else now
        self._forget_releases(now)
        if not self._releases:
            return float("inf")
        return (ahead + 1) * RELEASE_WINDOW_S / len(self._releases)

    async def acquire(self, lane: str, timeout_s: float | None = None, tokens: int = 0) -> None:
        """Take a slot, waiting at most `timeout_s` (and never past `max_wait_s`)."""
        if self.in_flight < self._limit and not self.waiting:
            self.in_flight += 1
            return
        wait = self.max_wait_s if timeout_s is None else min(timeout_s, self.max_wait_s)
        waiter = asyncio.get_running_loop().create_future()
        self._lanes[lane].append(waiter)
        self._lane_tokens[lane] += tokens
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
        finally:
            self._lane_tokens[lane] -= tokens

    def release(self) -> None:
        self.in_flight -= 1
        now = time.monotonic()
        self._releases.append(now)
        self._forget_releases(now)
        self._wake()

    def _forget_releases(self, now: float) -> None:
        while self._releases and self._releases[0] < now - RELEASE_WINDOW_S:
            self._releases.popleft()

    def _wake(self) -> None:
        for lane in LANES:  # VIP first, then realtime, then batch
            queue = self._lanes[lane]
            while queue and self.in_flight < self._limit:
                waiter = queue.popleft()
                if not waiter.done():
                    self.in_flight += 1
                    waiter.set_result(None)
