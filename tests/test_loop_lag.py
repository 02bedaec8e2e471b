"""The event-loop lag monitor: a loop held on purpose shows at its full length; an
idle loop reads near zero; the summary is the last minute's."""

from __future__ import annotations

import asyncio
import time

import pytest

from dashboards.console import health as H
from serving.guard.loop_lag import LoopLagMonitor


def test_a_blocked_loop_is_measured_at_the_length_it_was_held():
    samples: list[float] = []

    async def drill():
        monitor = LoopLagMonitor(samples.append, interval_s=0.02)
        monitor.start()
        await asyncio.sleep(0.2)  # idle: small lags only
        idle = list(samples)
        time.sleep(0.3)  # a slow callback holds the loop
        await asyncio.sleep(0.1)
        monitor.stop()
        return idle, monitor.describe()

    idle, summary = asyncio.run(drill())
    assert len(idle) >= 5 and max(idle) < 0.1
    blocked = [s for s in samples if s >= 0.25]
    # one sample, late by the block less the part of its interval that had passed
    # (and any scheduling delay of a busy machine)
    assert len(blocked) == 1 and blocked[0] < 0.45
    assert summary["max_s"] == summary["worst_s"] == blocked[0]
    assert summary["samples"] == len(samples) and summary["interval_s"] == 0.02
    assert summary["p50_s"] < 0.1


def test_describe_before_any_sample():
    summary = LoopLagMonitor(lambda s: None).describe()
    assert summary == {"samples": 0, "p50_s": None, "p99_s": None, "max_s": None,
                       "worst_s": 0.0, "interval_s": 0.1}


@pytest.mark.parametrize("p99_s,state", [(0.0004, H.GREEN), (0.001, H.GREEN),
                                         (0.003, H.AMBER), (0.02, H.RED)])
def test_console_line(p99_s, state):
    lag = {"samples": 600, "p50_s": 0.0002, "p99_s": p99_s, "max_s": 0.03, "worst_s": 0.4,
           "interval_s": 0.1}
    got, line = H.loop_lag(lag)
    assert got == state
    assert line == (f"Server event loop lag, last minute: p99 {p99_s * 1000:.1f} ms, max "
                    "30.0 ms (600 samples); worst since start 400 ms.")
    assert H.loop_lag(None)[0] == H.loop_lag({"samples": 0})[0] == H.GREY
