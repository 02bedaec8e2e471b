"""The gate in front of the engine: a concurrency limit and a prefill gate, with three
lanes.

A request holds a slot from admission until its engine request ends. It enters the
engine only while a slot is free and, when the prefill gate is on, while the prompt
tokens already in the engine and not yet prefilled leave room for its own (at most
`prefill_gate` tokens ahead of it, about one engine step; a prompt longer than the
gate enters an engine with no prefill pending). Why the gate: vLLM prefills what it
holds in arrival order, and a step in progress is never interrupted, so a request
sent to the engine behind 16 long documents waits for all of them whatever its lane.
Held in front instead, waiters are ordered by what matters for the SLO: VIP, then
realtime, then batch, and earliest deadline first within a lane (a short chat prompt
with 0.2 s to go before a document with 1.5 s). A prompt that does not fit waits and
nobody passes it, so a long document is never starved; the engine keeps about a
step's worth of prefill queued, so its steps stay full. VIPs are the exception: they
enter at once, past the limit and the gate (`slo.sim.lanes.enters_at_once`), and with
a VIP reserve on, the others enter only while the KV cache keeps that many tokens free
beyond their prompts (`slo.sim.lanes.kv_fits`), so a VIP finds room in it.

The limit and the gate can change at any time (the policies move them); lowering
either never interrupts requests already in the engine.

For the deadline check it also knows what waits in each lane (requests, prompt
tokens, deadlines) and how fast slots free up (releases per second, recent), so it
can say how long a newcomer in a lane would wait for a slot, and how fast ending
requests free the KV cache (the tokens they held, per second).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from slo.sim.engine_model import attention_pairs
from slo.sim.lanes import LANES, RELEASE_WINDOW_S, enters_at_once, gate_fits, kv_fits
from slo.sim.lanes import slot_wait_s



class LimiterTimeout(Exception):
    """A request waited longer than the limiter allows."""


class LimiterFull(Exception):
    """As many requests wait in front of the engine as the limiter holds (`max_queue`)."""


@dataclass(order=True, slots=True)
class _Waiter:
    rank: int  # its length class when lanes are ordered short class first, else 0
    deadline: float
    seq: int  # first come first served among equal deadlines
    tokens: int = field(compare=False)
    future: asyncio.Future | None = field(compare=False)
    held: bool = field(default=False, compare=False)  # kept out for a promise, once


class Limiter:
    def __init__(self, limit: int, max_wait_s: float = 120.0, prefill_gate: int | None = None,
                 max_queue: int = 0):
        self._limit = max(1, limit)
        self._gate = prefill_gate
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue  # requests that may wait at once; 0: no bound
        self.in_flight = 0
        self.engine_prefill_tokens = 0  # prompt tokens in the engine, not yet prefilled
        self.engine_prefill_prompts = 0  # how many prompts those are
        # The engine's per-request chunk cap (vLLM's long_prefill_token_threshold; 0:
        # none): with one, the engine prefills its prompts side by side, at most `cap`
        # tokens each a step, so the gate counts each prompt it holds as `cap` tokens.
        self.prefill_chunk_cap = 0
        # KV-cache tokens kept free for VIPs (None: no reserve), and how many tokens the
        # engine's cache has free now (set by the server from the engine's statistics)
        self._kv_reserve: int | None = None
        self.kv_free: Callable[[], int] = lambda: 1 << 62
        # Whether a prompt of a lane, so many tokens, due then, entering now would make
        # one the engine holds late (set by admission: `slo.policy.promises`)
        self.holds_back: Callable[[str, int, float], bool] = lambda lane, tokens, due: False
        self.promise_holds = 0  # requests it kept out at least once (a counter)
        self._lanes: dict[str, list[_Waiter]] = {lane: [] for lane in LANES}  # heaps
        self._waiting = 0
        self._seq = itertools.count()
        self._releases: deque[tuple[float, int]] = deque()  # (when, KV tokens freed)
        self._released_kv = 0  # their sum
        self._timer: tuple[float, asyncio.TimerHandle] | None = None  # `wake_at`'s

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit = max(1, int(value))
        self._wake()

    @property
    def prefill_gate(self) -> int | None:
        return self._gate

    @prefill_gate.setter
    def prefill_gate(self, tokens: int | None) -> None:
        self._gate = None if tokens is None else max(1, int(tokens))
        self._wake()

    @property
    def kv_reserve(self) -> int | None:
        return self._kv_reserve

    @kv_reserve.setter
    def kv_reserve(self, tokens: int | None) -> None:
        self._kv_reserve = None if not tokens else int(tokens)
        self._wake()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def slots_full(self) -> bool:
        """Requests wait because every slot is taken (not merely at the prefill gate)."""
        return self._waiting > 0 and self.in_flight >= self._limit

    def waiting_work(self, through_lane: str | None = None, deadline: float = float("inf"),
                     rank: int = 0) -> tuple[int, int, int]:
        """Prompt tokens of `waiting_prompts`: what is served before a newcomer; their
        attention pairs (fresh prompts: `attention_pairs(0, tokens)` each); how many."""
        prompts = self.waiting_prompts(through_lane, deadline, rank)
        return sum(prompts), sum(attention_pairs(0, tokens) for tokens in prompts), len(prompts)

    def waiting_prompts(self, through_lane: str | None = None, deadline: float = float("inf"),
                        rank: int = 0) -> list[int]:
        """The prompts (their tokens) waiting in the lanes before `through_lane` and in
        it those ordered before a newcomer of that `rank` due by `deadline` (all lanes
        and all waiters when None), in the order they will enter the engine."""
        end = len(LANES) if through_lane is None else LANES.index(through_lane) + 1
        prompts = []
        for lane in LANES[:end]:
            last = through_lane is not None and lane == LANES[end - 1]
            prompts += [w.tokens for w in sorted(self._lanes[lane])
                        if not last or (w.rank, w.deadline) <= (rank, deadline)]
        return prompts

    def slot_wait_s(self, lane: str, now: float | None = None, at_once: bool = False,
                    p90: bool = True) -> float:
        """The wait for a slot for a newcomer in `lane` (`lanes.slot_wait_s`: its 90th
        percentile, or with `p90` false its mean): none for a VIP or a booked
        retry (`at_once`) or while a slot is free (a wait at the gate is prefill work
        ahead); else a release for each request over the limit (VIPs and booked retries
        enter past it; a cut), each ahead and itself, at the recent release rate
        (infinite when nothing was released lately)."""
        if enters_at_once(lane, at_once) or self.in_flight < self._limit:
            return 0.0
        end = LANES.index(lane) + 1
        ahead = sum(len(self._lanes[name]) for name in LANES[:end])
        self._forget_releases(time.monotonic() if now is None else now)
        return slot_wait_s(ahead, self.in_flight - self._limit, len(self._releases), p90)

    async def acquire(self, lane: str, timeout_s: float | None = None, tokens: int = 0,
                      deadline: float | None = None, rank: int = 0,
                      at_once: bool = False) -> None:
        """Enter the engine with `tokens` of prompt, waiting at most `timeout_s` (and
        never past `max_wait_s`); `rank`, then `deadline` order the lane (default: rank
        0, now, i.e. first come first served). `at_once`: a refused request back for
        its booking (`slo.policy.retry_book`) enters as a VIP does, past the limit and
        the gate: its Retry-After was a promise, and the slot the surge's newcomers
        took meanwhile is no reason to break it."""
        due = time.monotonic() if deadline is None else deadline
        waiter = _Waiter(rank, due, next(self._seq), tokens, None)  # a future once it waits
        if enters_at_once(lane, at_once) or \
                (not self._waiting and self._fits(tokens, lane, due, waiter)):
            self._enter(tokens)
            return
        if self.max_queue and self._waiting >= self.max_queue:
            raise LimiterFull(f"{self._waiting} requests wait for the engine already; at "
                              f"most {self.max_queue} may")
        wait = self.max_wait_s if timeout_s is None else min(timeout_s, self.max_wait_s)
        waiter.future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._lanes[lane], waiter)
        self._waiting += 1
        if self._waiting > 1:  # others waited, so nobody asked if it fits: ask in lane order
            self._wake()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), wait)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(tokens or None)  # it entered just as we gave up: pass it on
            else:
                waiter.future.cancel()
                self._forget(lane, waiter)
            if isinstance(exc, asyncio.TimeoutError):
                raise LimiterTimeout(f"waited {wait:g} s for an engine slot")
            raise

    def prefilled(self, tokens: int, finished: bool = False) -> None:
        """`tokens` of a request's prompt are prefilled (`finished`: the last of them):
        they no longer stand at the gate."""
        self.engine_prefill_tokens -= tokens
        if finished:
            self.engine_prefill_prompts = max(0, self.engine_prefill_prompts - 1)
        self._wake()

    def release(self, pending_tokens: int | None = None, kv_tokens: int = 0) -> None:
        """A request left the engine; `pending_tokens`: what was left of its prompt, if
        it left before its first token (else None: `prefilled` already took it off);
        `kv_tokens`: the KV cache it held (its prompt and the tokens it generated)."""
        self.in_flight -= 1
        if pending_tokens is not None:
            self.engine_prefill_tokens -= pending_tokens
            self.engine_prefill_prompts = max(0, self.engine_prefill_prompts - 1)
        now = time.monotonic()
        self._releases.append((now, kv_tokens))
        self._released_kv += kv_tokens
        self._forget_releases(now)
        self._wake()

    def _fits(self, tokens: int, lane: str, due: float, waiter: _Waiter | None = None) -> bool:
        return self.in_flight < self._limit and gate_fits(
            self.engine_prefill_tokens, tokens, self._gate, self.engine_prefill_prompts,
            self.prefill_chunk_cap) and kv_fits(
            self.kv_free() if self._kv_reserve else 0, self.engine_prefill_tokens, tokens,
            self._kv_reserve, self.in_flight) and not self._kept_out(lane, tokens, due, waiter)

    def _kept_out(self, lane: str, tokens: int, due: float, waiter: _Waiter | None) -> bool:
        """The promise keeper's answer; a waiter it keeps out is counted once."""
        held = self.holds_back(lane, tokens, due)
        if held and waiter is not None and not waiter.held:
            waiter.held = True
            self.promise_holds += 1
        return held

    def _enter(self, tokens: int) -> None:
        self.in_flight += 1
        self.engine_prefill_tokens += tokens
        self.engine_prefill_prompts += tokens > 0

    def _forget(self, lane: str, waiter: _Waiter) -> None:
        heap = self._lanes[lane]
        if waiter not in heap:
            return
        heap.remove(waiter)
        heapq.heapify(heap)
        self._waiting -= 1
        self._wake()  # it may have held back the ones behind it at the gate

    def kv_free_rate(self, now: float | None = None) -> float:
        """KV-cache tokens freed a second by requests ending, over the recent window."""
        self._forget_releases(time.monotonic() if now is None else now)
        return self._released_kv / RELEASE_WINDOW_S

    def release_rate(self, now: float | None = None) -> float:
        """Requests ended a second, over the recent window."""
        self._forget_releases(time.monotonic() if now is None else now)
        return len(self._releases) / RELEASE_WINDOW_S

    def _forget_releases(self, now: float) -> None:
        while self._releases and self._releases[0][0] < now - RELEASE_WINDOW_S:
            self._released_kv -= self._releases.popleft()[1]

    def wake_at(self, when: float) -> None:
        """Ask the waiters again by monotonic `when`: a hold that time ends (a retry not come)."""
        if self._timer is not None and self._timer[0] <= when:
            return
        if self._timer is not None:
            self._timer[1].cancel()
        handle = asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()),
                                                       self._timed_wake)
        self._timer = (when, handle)

    def _timed_wake(self) -> None:
        self._timer = None
        self._wake()

    def _wake(self) -> None:
        """Hand the room out in lane order, earliest deadline first; stop at the first
        waiter that does not fit, so nobody passes it."""
        for lane in LANES:
            heap = self._lanes[lane]
            while heap:
                head = heap[0]
                if not self._fits(head.tokens, lane, head.deadline, head):  # no VIP here
                    return
                heapq.heappop(heap)
                self._waiting -= 1
                if not head.future.done():
                    self._enter(head.tokens)
                    head.future.set_result(None)
