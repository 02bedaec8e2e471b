"""The simulator's gate in front of the engine: `serving.limiter`'s lanes and prefill
gate in simulated time.

Waiting requests are held in three lanes, handed engine slots in lane order (VIP,
realtime, batch) and earliest deadline first within a lane (a request's deadline is
its arrival plus its TTFT target; without a target, its arrival); the head of the
lanes enters only while a slot is free and, with the prefill gate on, while the
prompt tokens in the engine not yet prefilled leave room for its own (a prompt
longer than the gate enters an engine with no prefill pending), and nobody passes a
head that does not fit. VIPs are never held (`enters_at_once`). A realtime request
whose slot has not come by its deadline less its own prefill moves to the batch lane,
as the server's admission moves it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Final

from observe import registry as R

LANE_VIP: Final = "vip"  # the limiter's lanes (serving.limiter, admission, the simulator), in the
LANES: Final = (LANE_VIP, *R.PRIORITIES)  # order slots are handed out
RELEASE_WINDOW_S: Final = 10.0  # how far back slot releases count toward the release rate
SLOT_WAIT_Z: Final = 1.2816  # the standard normal's 90th percentile (`releases_p90`)


def lane_of(req) -> str:
    return LANE_VIP if req.vip else req.priority


# Engine priorities (vLLM's `--scheduling-policy priority`, smaller first): the lane
# first, then the deadline in milliseconds since the server started, so 10**12 ms (31
# years) of deadlines fit inside a lane.
LANE_PRIORITY_STEP: Final = 10**12


def engine_priority(lane: str, deadline_s: float, epoch_s: float) -> int:
    """The engine's order for a request (vLLM's waiting queue and its preemption
    victim): its lane, then earliest deadline first. VIPs enter the engine at once, so
    inside vLLM first-come order put a short VIP prompt due in 0.2 s behind a VIP
    document due in 1 s that came 50 ms earlier; in five 10x surges in first-come order
    the late VIPs had 0.7-2.0k VIP prompt tokens arrive in the 0.3 s before them, the
    on-time ones 0.3-0.8k (docs/benchmarks.md, "Deadlines as engine priorities")."""
    due_ms = min(LANE_PRIORITY_STEP - 1, max(0, round((deadline_s - epoch_s) * 1000)))
    return LANES.index(lane) * LANE_PRIORITY_STEP + due_ms


def vip_priority(priority: int) -> bool:
    """An engine priority in the VIP lane's range: the engine prefills it first
    (`serving.guard.vip_first`). With the deadline policy off every priority is 0."""
    return priority < LANE_PRIORITY_STEP


def vips_first(order: list, kv_free: int) -> list | None:
    """The simulated engine's prompts (`order`: started first, then by priority) that a
    step prefills (a lone one uncapped) under `serving.guard.vip_first`: the VIPs'
    started ones, and their waiting ones while each fits `kv_free`; None: vLLM's own
    rule (no VIP prompt to prefill, or every request a VIP's)."""
    if all(vip_priority(r.engine_priority) for r in order):
        return None
    vips = [r for r in order if r.started and r.first_token is None
            and vip_priority(r.engine_priority)]
    for r in (r for r in order if not r.started):
        context = r.context or r.prompt  # a preempted one recomputes what it generated
        if not vip_priority(r.engine_priority) or context > kv_free:
            break
        vips.append(r)
        kv_free -= context
    return vips or None


def deadline_of_priority(priority: int, epoch_s: float) -> float:
    """The deadline (monotonic seconds) an `engine_priority` was made from."""
    return epoch_s + (priority % LANE_PRIORITY_STEP) / 1000


def enters_at_once(lane: str, booked: bool = False) -> bool:
    """VIPs are never held in front: they enter the engine at once, past the slot limit
    and the prefill gate; so does a refused request back for its booking (`booked`:
    `slo.policy.retry_book`), whose Retry-After was a promise. Held there, a short VIP
    prompt waited for the documents admitted before it to prefill (7 of 9 VIP misses
    in one surge); let in, it waits only for the engine's own order. On design seeds
    1-2 (5x and 10x surges) VIPs on time went from 69-77% to 85-91%, goodput 11.76 ->
    11.96 requests/s summed."""
    return lane == LANE_VIP or booked


def deadline_of(req) -> float:
    return req.arrival + (req.target_s if req.target_s is not None else 0.0)


def gate_fits(pending_tokens: int, tokens: int, gate: int | None, pending_prompts: int = 0,
              chunk_cap: int = 0) -> bool:
    """The prefill gate's rule (serving.limiter's and the simulator's): whether a prompt
    of `tokens` may enter an engine holding `pending_tokens` not yet prefilled, of
    `pending_prompts` prompts, under a gate of `gate` tokens (None: no gate). Under a
    per-request chunk cap the engine prefills its prompts side by side, so each prompt
    it holds counts as one `chunk_cap`-token chunk."""
    if gate is None:
        return True
    if chunk_cap:
        return pending_prompts <= 0 or pending_prompts * chunk_cap + min(chunk_cap, tokens) <= gate
    return pending_tokens <= 0 or pending_tokens + tokens <= gate


def kv_fits(kv_free: int, pending_tokens: int, tokens: int, reserve: int | None,
            in_engine: int) -> bool:
    """The VIP reserve's rule (serving.limiter's and the simulator's): whether a non-VIP
    prompt of `tokens` may enter an engine whose KV cache has `kv_free` tokens free,
    holding `in_engine` requests with `pending_tokens` not yet prefilled, so that
    `reserve` tokens stay free once they and it are prefilled (None: no reserve). vLLM
    starts a waiting prompt only when all of it fits the free cache and preempts nobody
    for it, so a VIP arriving into a full cache waits for running requests to end (in
    four design surges with VIPs past the gate, 7 of 9 VIP misses came with the cache
    80-98% full). An empty engine takes any prompt: its cache is free whatever the
    reading says."""
    if reserve is None or in_engine <= 0:
        return True
    return kv_free - pending_tokens - tokens >= reserve


def slot_wait_s(ahead: int, over: int, releases: int, p90: bool = True) -> float:
    """The slot wait's rule (serving.limiter's and the simulator's; each caller knows
    when a slot is free and there is none): a release for each request over the limit
    (VIPs enter past it; a cut), each of the `ahead` waiters served first and the
    newcomer itself, at the rate of the `releases` within `RELEASE_WINDOW_S` (infinite
    when nothing was released lately); the wait's 90th percentile (`releases_p90`), or
    with `p90` false its mean (what the latency prediction starts from)."""
    if not releases:
        return float("inf")
    count = ahead + 1 + max(0, over)
    return (releases_p90(count) if p90 else count) * RELEASE_WINDOW_S / releases


def releases_p90(count: int) -> float:
    """The 90th percentile of the time to `count` releases that come at random (a
    Poisson stream) at one per unit of time: Gamma(count)'s, by Wilson and Hilferty's
    cube-root approximation (within 1%). With the mean (`count`) the check admitted
    requests whose slot then came late: in the 10x surge recorded for the replay
    validation, 14 of the 38 admitted realtime requests that waited in front with an
    estimate over 75% of their target missed it, against 1 of 135 between 35 and 75%
    (docs/benchmarks.md, "The slot wait at its 90th percentile")."""
    return count * (1 - 1 / (9 * count) + SLOT_WAIT_Z / (3 * math.sqrt(count))) ** 3


def kv_reserved_from(lane: str, reserve: int | None) -> int:
    """The KV-cache tokens a newcomer in `lane` cannot use: the VIP reserve, for anyone
    but a VIP (the deadline check's KV wait, server's and simulator's)."""
    return 0 if enters_at_once(lane) else reserve or 0


class Lanes:
    def __init__(self):
        self._heaps: dict[str, list] = {lane: [] for lane in LANES}
        self._seq = itertools.count()  # first come first served among equal deadlines

    def __len__(self) -> int:
        return sum(len(heap) for heap in self._heaps.values())

    def push(self, req, lane: str | None = None) -> None:
        heapq.heappush(self._heaps[lane or lane_of(req)],
                       (deadline_of(req), next(self._seq), req))

    def ahead(self, lane: str, deadline: float) -> Iterator:
        """The waiters served before a newcomer to `lane` due at `deadline`: every one
        in the lanes before it, and those in it due by then."""
        for name in LANES[:LANES.index(lane) + 1]:
            for due, _, req in self._heaps[name]:
                if name != lane or due <= deadline:
                    yield req

    def pop_ready(self, fits: Callable[[object], bool]) -> Iterator:
        """The waiters that enter now, in lane order, earliest deadline first; stops at
        the first that does not fit (`fits` is asked again after each one enters)."""
        for lane in LANES:
            heap = self._heaps[lane]
            while heap:
                if not enters_at_once(lane) and not fits(heap[0][2]):
                    return
                yield heapq.heappop(heap)[2]

    def demote_late(self, now: float, own_s: Callable[[object], float]) -> None:
        """Move realtime waiters with a target whose slot can no longer come in time
        (deadline less their own prefill `own_s`, passed) to the batch lane."""
        heap = self._heaps[R.PRIORITY_REALTIME]
        late = [item for item in heap
                if item[2].target_s is not None and item[0] - own_s(item[2]) < now]
        if not late:
            return
        gone = {seq for _, seq, _ in late}
        self._heaps[R.PRIORITY_REALTIME] = [item for item in heap if item[1] not in gone]
        heapq.heapify(self._heaps[R.PRIORITY_REALTIME])
        for _, _, req in late:
            req.priority = R.PRIORITY_BATCH
            req.actions.append("demote:deadline")
            self.push(req, R.PRIORITY_BATCH)
