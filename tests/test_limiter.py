"""The limiter's prefill gate and its earliest-deadline-first lanes, exactly: who enters
the engine, in what order, and what the deadline check is told waits ahead."""

from __future__ import annotations

import asyncio
import time

import pytest

from observe import registry as R
from serving.limiter import Limiter, LimiterTimeout
from slo.sim.lanes import LANE_VIP, releases_p90

RT, BATCH = R.PRIORITY_REALTIME, R.PRIORITY_BATCH


async def _settle() -> None:
    """Let woken waiters run (a wake passes through wait_for and shield: a few turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def _queue(limiter: Limiter, entries: list[tuple[str, str, int, float]],
                 order: list[str]) -> list[asyncio.Task]:
    """Start a waiter per (name, lane, tokens, deadline); each appends its name to
    `order` when it enters the engine."""
    async def one(name, lane, tokens, deadline):
        await limiter.acquire(lane, tokens=tokens, deadline=deadline)
        order.append(name)
    tasks = []
    for entry in entries:  # queued one after another, as they would arrive
        tasks.append(asyncio.create_task(one(*entry)))
        await _settle()
    return tasks


def test_the_gate_lets_in_what_fits_and_holds_the_rest_in_front():
    async def scenario():
        limiter = Limiter(16, prefill_gate=2048)
        order: list[str] = []
        tasks = await _queue(limiter, [("a", RT, 1500, 1.0), ("b", RT, 500, 2.0),
                                       ("c", RT, 100, 3.0)], order)
        entered = list(order)
        held = (limiter.in_flight, limiter.engine_prefill_tokens, limiter.waiting)
        limiter.prefilled(1500)  # a's first token: 500 left in the engine, c fits
        await _settle()
        await asyncio.gather(*tasks)
        return entered, held, order, limiter.engine_prefill_tokens
    entered, held, order, left = asyncio.run(scenario())
    assert entered == ["a", "b"] and held == (2, 2000, 1)
    assert order == ["a", "b", "c"] and left == 600


def test_a_prompt_longer_than_the_gate_enters_an_engine_with_no_prefill_pending():
    async def scenario():
        limiter = Limiter(16, prefill_gate=2048)
        order: list[str] = []
        await limiter.acquire(RT, tokens=10)  # 10 tokens pending in the engine
        tasks = await _queue(limiter, [("doc", BATCH, 4000, 1.0)], order)
        before = list(order)
        limiter.prefilled(10)
        await asyncio.gather(*tasks)
        return before, order, limiter.engine_prefill_tokens
    assert asyncio.run(scenario()) == ([], ["doc"], 4000)


def test_nobody_passes_a_waiter_that_does_not_fit():
    """A document at the head of its lane is not starved by short prompts behind it."""
    async def scenario():
        limiter = Limiter(16, prefill_gate=1000)
        order: list[str] = []
        await limiter.acquire(RT, tokens=600)
        tasks = await _queue(limiter, [("doc", RT, 900, 1.0), ("short", RT, 150, 2.0)],
                             order)
        before = list(order)
        limiter.prefilled(600)
        await _settle()
        after_one = list(order)
        limiter.prefilled(900)
        await asyncio.gather(*tasks)
        return before, after_one, order
    assert asyncio.run(scenario()) == ([], ["doc"], ["doc", "short"])


def test_lanes_in_order_and_earliest_deadline_first_within_each():
    async def scenario():
        limiter = Limiter(1)
        order: list[str] = []
        await limiter.acquire(RT)  # the one slot is taken
        tasks = await _queue(limiter, [
            ("batch-early", BATCH, 0, 0.5), ("rt-late", RT, 0, 9.0), ("rt-early", RT, 0, 1.0),
            ("vip", LANE_VIP, 0, 50.0), ("rt-tie-first", RT, 0, 5.0),
            ("rt-tie-second", RT, 0, 5.0)], order)
        for _ in tasks:
            limiter.release()
            await _settle()
        await asyncio.gather(*tasks)
        return order
    assert asyncio.run(scenario()) == ["vip", "rt-early", "rt-tie-first", "rt-tie-second",
                                       "rt-late", "batch-early"]


def test_waiting_work_counts_earlier_lanes_and_earlier_deadlines_in_its_own():
    async def scenario():
        limiter = Limiter(1)
        await limiter.acquire(RT)
        tasks = await _queue(limiter, [("v", LANE_VIP, 300, 9.0), ("r1", RT, 200, 1.0),
                                       ("r2", RT, 50, 3.0), ("b", BATCH, 1000, 0.1)], [])
        counts = (limiter.waiting_work(), limiter.waiting_work(LANE_VIP, 0.0),
                  limiter.waiting_work(RT, 2.0), limiter.waiting_work(RT),
                  limiter.waiting_work(BATCH, 0.0))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return counts, limiter.waiting
    # the VIP entered at once: nothing of it waits. Attention pairs, fresh prompts
    # each: n * (n + 1) / 2; and how many prompts
    r1, r2, b = 200 * 201 // 2, 50 * 51 // 2, 1000 * 1001 // 2
    assert asyncio.run(scenario()) == (((1250, r1 + r2 + b, 3), (0, 0, 0),
                                        (200, r1, 1), (250, r1 + r2, 2),
                                        (250, r1 + r2, 2)), 0)


def test_a_vip_enters_at_once_past_a_full_limit_and_a_full_gate():
    async def scenario():
        limiter = Limiter(1, prefill_gate=100)
        await limiter.acquire(RT, tokens=100)  # the slot and the gate are full
        order: list[str] = []
        tasks = await _queue(limiter, [("rt", RT, 10, 0.0), ("vip", LANE_VIP, 50, 9.0)],
                             order)
        state = (list(order), limiter.in_flight, limiter.engine_prefill_tokens,
                 limiter.waiting)
        limiter.release(100)  # the first request leaves; the VIP still holds a slot
        await _settle()
        held = list(order)
        limiter.release(50)  # the VIP leaves too: the realtime waiter enters
        await _settle()
        await asyncio.gather(*tasks)
        return state, held, order
    assert asyncio.run(scenario()) == ((["vip"], 2, 150, 1), ["vip"], ["vip", "rt"])


def test_a_booked_retry_enters_at_once_past_a_full_limit_and_a_waiter_due_earlier():
    """`at_once` (a refused request back for its booking): in its own lane, past the
    slot, the gate and a realtime waiter due before it; no slot wait to estimate."""
    async def scenario():
        limiter = Limiter(1, prefill_gate=100)
        await limiter.acquire(RT, tokens=100)
        order: list[str] = []
        tasks = await _queue(limiter, [("rt", RT, 10, 0.0)], order)
        waits = (limiter.slot_wait_s(RT), limiter.slot_wait_s(RT, at_once=True))
        await limiter.acquire(RT, tokens=50, deadline=9.0, at_once=True)
        state = (list(order), limiter.in_flight, limiter.engine_prefill_tokens,
                 limiter.waiting)
        limiter.release(100)
        limiter.release(50)
        await asyncio.gather(*tasks)
        return waits, state, order
    assert asyncio.run(scenario()) == ((float("inf"), 0.0), ([], 2, 150, 1), ["rt"])


def test_the_vip_reserve_holds_others_until_the_cache_keeps_it_free_beyond_them():
    async def scenario():
        limiter = Limiter(16)
        free = [2000]  # KV-cache tokens free, as the engine's statistics say
        limiter.kv_free = lambda: free[0]
        limiter.kv_reserve = 1000
        await limiter.acquire(RT, tokens=100)  # 100 tokens in the engine, not prefilled
        order: list[str] = []
        # 2000 - 100 - 950 = 950 free after it: under the reserve; 2000 - 100 - 900 fits
        tasks = await _queue(limiter, [("rt", RT, 950, 1.0), ("vip", LANE_VIP, 900, 9.0)],
                             order)
        held = (list(order), limiter.waiting)
        free[0] = 2950  # the VIP's 900 tokens are still to come: 2950 - 900 - 950 < 1000
        await _settle()
        limiter.prefilled(100, finished=True)
        still = list(order)
        free[0] = 3000
        limiter.prefilled(0)  # 3000 - 900 - 950 = 1150: it enters
        await _settle()
        await asyncio.gather(*tasks)
        return held, still, order
    assert asyncio.run(scenario()) == ((["vip"], 1), ["vip"], ["vip", "rt"])


def test_the_vip_reserve_lets_anything_into_an_empty_engine_and_off_means_off():
    async def scenario():
        limiter = Limiter(16)
        limiter.kv_free = lambda: 0  # a stale reading: the cache looks full
        limiter.kv_reserve = 1000
        await limiter.acquire(RT, tokens=500)  # an empty engine takes it
        order: list[str] = []
        tasks = await _queue(limiter, [("rt", RT, 10, 1.0)], order)
        held = list(order)
        limiter.kv_reserve = 0  # off: the waiter enters at once
        await _settle()
        await asyncio.gather(*tasks)
        return held, order, limiter.kv_reserve
    assert asyncio.run(scenario()) == ([], ["rt"], None)


def test_a_request_held_back_for_an_earlier_promise_enters_when_a_chunk_frees_it():
    """The promise keeper (admission's `holds_back`) is asked with the lane, prompt
    tokens and deadline of whoever would enter; a VIP is never asked; each chunk
    prefilled asks again, and those behind a held one wait for it."""
    async def scenario():
        limiter = Limiter(16)
        asked: list[tuple[str, int, float]] = []
        holding = [True]

        def holds_back(lane, tokens, due):
            asked.append((lane, tokens, due))
            return holding[0] and tokens > 100
        limiter.holds_back = holds_back
        order: list[str] = []
        tasks = await _queue(limiter, [("doc", BATCH, 3000, 9.0), ("vip", LANE_VIP, 500, 5.0),
                                       ("short", BATCH, 50, 10.0)], order)
        held = list(order)
        limiter.prefilled(0)  # asked again, held again: still one request held
        holds = limiter.promise_holds
        holding[0] = False
        limiter.prefilled(256)  # a chunk of the earlier prompt: ask again
        await _settle()
        await asyncio.gather(*tasks)
        return held, order, asked, holds
    held, order, asked, holds = asyncio.run(scenario())
    assert held == ["vip"] and order == ["vip", "doc", "short"] and holds == 1
    # kept out on arrival, then asked again as it waits: one request held, counted once
    assert asked[0] == (BATCH, 3000, 9.0) and all(lane != LANE_VIP for lane, _, _ in asked)


def test_a_waiter_that_gives_up_frees_those_held_behind_it():
    async def scenario():
        limiter = Limiter(16, prefill_gate=1000)
        order: list[str] = []
        await limiter.acquire(RT, tokens=900)
        stuck = asyncio.create_task(limiter.acquire(RT, 0.05, tokens=800, deadline=1.0))
        await _settle()
        behind = await _queue(limiter, [("short", RT, 50, 2.0)], order)
        with pytest.raises(LimiterTimeout):
            await stuck
        await asyncio.gather(*behind)
        return order, limiter.waiting, limiter.engine_prefill_tokens
    assert asyncio.run(scenario()) == (["short"], 0, 950)


def test_leaving_before_the_first_token_takes_the_prompt_off_the_gate():
    async def scenario():
        limiter = Limiter(4, prefill_gate=1000)
        await limiter.acquire(RT, tokens=700)
        await limiter.acquire(RT, tokens=200)
        limiter.prefilled(200, finished=True)
        limiter.release()  # the second ended after its first token
        limiter.release(700)  # the first failed before it
        return limiter.in_flight, limiter.engine_prefill_tokens, limiter.engine_prefill_prompts
    assert asyncio.run(scenario()) == (0, 0, 0)


def test_with_a_chunk_cap_the_gate_counts_each_prompt_as_one_capped_chunk():
    """The engine prefills its prompts side by side, `cap` tokens each a step: a
    newcomer enters while its chunk and one of each prompt there fit the gate, however
    long those prompts are."""
    async def scenario():
        limiter = Limiter(8, prefill_gate=1000)
        limiter.prefill_chunk_cap = 256
        await limiter.acquire(RT, tokens=3000)  # nothing pending: enters
        await limiter.acquire(RT, tokens=3000)  # 256 + 256 <= 1000 (by tokens: 6000)
        await limiter.acquire(RT, tokens=100)  # 2 x 256 + 100
        order: list[str] = []
        waiting = await _queue(limiter, [("fourth", RT, 500, 1.0)], order)
        await _settle()
        held = (list(order), limiter.engine_prefill_prompts)  # 3 x 256 + 256 > 1000
        limiter.prefilled(100, finished=True)  # the short one is done: room for one
        await asyncio.gather(*waiting)
        limiter.prefilled(2048)  # a chunk of a document: still pending
        return held, order, limiter.engine_prefill_prompts, limiter.engine_prefill_tokens
    assert asyncio.run(scenario()) == (([], 3), ["fourth"], 3, 6500 - 2048)


def test_opening_the_gate_or_turning_it_off_lets_the_waiters_in():
    async def scenario():
        limiter = Limiter(16, prefill_gate=100)
        order: list[str] = []
        await limiter.acquire(RT, tokens=100)
        tasks = await _queue(limiter, [("a", RT, 100, 1.0), ("b", RT, 100, 2.0)], order)
        limiter.prefill_gate = 200
        await _settle()
        widened = list(order)
        limiter.prefill_gate = None
        await asyncio.gather(*tasks)
        return widened, order, limiter.slots_full
    assert asyncio.run(scenario()) == (["a"], ["a", "b"], False)


def test_slots_full_means_a_slot_wait_not_a_gate_wait():
    async def scenario():
        limiter = Limiter(1, prefill_gate=100)
        await limiter.acquire(RT, tokens=100)
        waiter = asyncio.create_task(limiter.acquire(RT, tokens=10))
        await _settle()
        full, slot_wait = limiter.slots_full, limiter.slot_wait_s(RT)
        vip_wait = limiter.slot_wait_s(LANE_VIP)  # a VIP enters at once all the same
        limiter.limit = 2  # a slot is free: what is left is the gate
        gate_only, gate_wait = limiter.slots_full, limiter.slot_wait_s(RT)
        limiter.prefilled(100)
        await waiter
        return full, slot_wait, vip_wait, gate_only, gate_wait
    assert asyncio.run(scenario()) == (True, float("inf"), 0.0, False, 0.0)


@pytest.mark.parametrize("limit,releases", [
    (7, 0),  # a slot is free
    (6, 1),  # full: the next release is its
    (4, 3),  # two over the limit (VIPs entered past it) leave first, then its own
    (2, 5),  # a cut from 6 to 2: four must leave before a slot frees
])
def test_the_slot_wait_counts_every_request_over_the_limit(limit, releases):
    """Four releases over the 10 s window: one every 2.5 s on average; the wait for
    that many releases at its 90th percentile (`slo.sim.lanes.releases_p90`)."""
    expected = releases_p90(releases) * 2.5 if releases else 0.0
    limiter = Limiter(8)
    limiter.in_flight = 10
    for _ in range(4):
        limiter.release(None)
    limiter.limit = limit
    assert (limiter.in_flight, limiter.slot_wait_s(RT)) == (6, expected)
    assert limiter.slot_wait_s(RT, p90=False) == releases * 2.5  # its mean


def test_the_kv_free_rate_is_what_ending_requests_held_over_the_recent_window():
    limiter = Limiter(4)
    limiter.in_flight = 2
    limiter.release(None, kv_tokens=1000)
    limiter.release(None, kv_tokens=500)
    assert limiter.kv_free_rate() == 150.0  # 1,500 tokens over the 10 s window
    assert limiter.release_rate() == 0.2  # two requests over the 10 s window
    assert limiter.kv_free_rate(time.monotonic() + 11) == 0.0  # forgotten
    assert limiter.release_rate(time.monotonic() + 11) == 0.0
    assert limiter.in_flight == 0


def test_a_newcomer_of_an_earlier_lane_passes_a_held_waiter_at_once_and_time_frees_it():
    """Nothing in the engine to step: a realtime newcomer behind a batch document the
    promise keeper holds enters as it comes, not at the next engine event; and a hold
    that ends with time (`wake_at`) is asked again then."""
    async def scenario():
        limiter, holding = Limiter(16), [True]
        limiter.holds_back = lambda lane, tokens, due: holding[0] and tokens > 100
        order: list[str] = []
        tasks = await _queue(limiter, [("doc", BATCH, 2000, 9.0),
                                       ("chat", RT, 50, 5.0)], order)
        entered = list(order)
        holding[0] = False
        limiter.wake_at(time.monotonic() + 0.05)
        limiter.wake_at(time.monotonic() + 5.0)  # a later one: the earlier stands
        await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
        return entered, order
    assert asyncio.run(scenario()) == (["chat"], ["chat", "doc"])
