"""The policy loop sleeps a whole tick at idle and is woken, not polled, when the
engine fails: breaker L2 acts at once without ten wake-ups a second (about 2 ms of an
idle server's CPU a second, docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from observe.tracelog import TraceLog
from serving.engine.fault_injection import FaultInjector
from serving.guard.loop import TICK_S, Guard
from slo.policy import conditions as P
from slo.policy.conditions import PolicyConfig
from slo.policy.lifecycle import ACTIVE


def guard_with(faults: FaultInjector) -> Guard:
    return Guard(PolicyConfig(), TraceLog(), SimpleNamespace(record_policy=lambda *a: None),
                 faults)


async def seconds_until_tick(guard: Guard, poke) -> float:
    started = time.monotonic()
    waiting = asyncio.create_task(guard._until_next_tick())
    await asyncio.sleep(0.05)
    poke()
    await waiting
    return time.monotonic() - started


def test_a_failure_or_a_drill_wakes_the_loop_at_once_and_nothing_else_does():
    faults = FaultInjector(enabled=True)
    guard = guard_with(faults)

    async def run() -> list[float]:
        return [await seconds_until_tick(guard, guard.wake),  # a request saw it fail
                await seconds_until_tick(guard, lambda: faults.set("error")),  # a drill
                await seconds_until_tick(guard, lambda: None)]  # nothing: a whole tick

    woken, drilled, idle = asyncio.run(run())
    assert woken < TICK_S / 2 and drilled < TICK_S / 2
    assert idle >= TICK_S


def test_no_wake_while_breaker_l2_is_already_active():
    guard = guard_with(FaultInjector())
    guard.engine.machines[P.BREAKER_L2].state = ACTIVE  # its restart is under way
    assert asyncio.run(seconds_until_tick(guard, guard.wake)) >= TICK_S
