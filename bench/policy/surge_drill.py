"""The breaker drill: steady load, an injected slow engine long enough to trip breaker
L1, the fault cleared, and the SLO attainment of the requests that *arrive* after the
clear against those that arrived before the fault (throughput after the clear would
count the backlog of the fault draining as recovery)."""

from __future__ import annotations

import asyncio
import time

from bench.policy.surge_scoring import meets
from bench.policy.surge_server import admin, drive

DRILL_WINDOWS = ((0, 10), (10, 20), (20, 30))  # seconds after the clear, by arrival
RECOVERED_SHARE = 0.9  # goal: the last window's attainment >= 90% of the baseline's


def attainment(results: list) -> float | None:
    """Share of the requests sent that met their TTFT target; shed or failed ones miss."""
    return sum(meets(r) for r in results) / len(results) if results else None


def drill_recovery(results: list, fault_s: float, clear_s: float) -> dict:
    """SLO attainment by arrival time (`sent_s`, seconds after the run started): the
    10 s before the fault, and each window of DRILL_WINDOWS after the clear. A request
    sent before the clear and served after it is the backlog, not recovery: it counts
    in no window after the clear."""
    def sent(lo: float, hi: float) -> list:
        return [r for r in results if lo <= r.sent_s < hi]

    base = attainment(sent(fault_s - 10, fault_s))
    after = {f"{lo}-{hi}s": attainment(sent(clear_s + lo, clear_s + hi))
             for lo, hi in DRILL_WINDOWS}
    last = after[f"{DRILL_WINDOWS[-1][0]}-{DRILL_WINDOWS[-1][1]}s"]
    recovered = last / base if base and last is not None else None
    return {"baseline_attainment": base, "attainment_after_clear": after,
            "recovered": recovered,
            "met": recovered is not None and recovered >= RECOVERED_SHARE}


def breaker_drill(url: str, rate: float, fault_s: float) -> dict:
    """Steady load; a slow engine from 30 s for `fault_s`; recovery by arrival."""
    async def scenario():
        load = asyncio.create_task(drive(url, "steady", rate, 30 + fault_s + 40, 99))
        await asyncio.sleep(30)
        admin(url, "PUT", "/admin/faults", {"mode": "slow", "delay_s": 2.0})
        fault_at = time.monotonic()
        await asyncio.sleep(fault_s)
        admin(url, "PUT", "/admin/faults", {"mode": "none"})
        clear_at = time.monotonic()
        return await load, fault_at, clear_at

    started = time.monotonic()
    by_key, fault_at, clear_at = asyncio.run(scenario())
    every = [r for rs in by_key.values() for r in rs]
    events = admin(url, "GET", "/admin/audit")["events"]
    return {**drill_recovery(every, fault_at - started, clear_at - started),
            "breaker_events": [(e["from_state"], e["to_state"]) for e in events
                               if e["policy"] == "breaker_l1"][::-1]}
