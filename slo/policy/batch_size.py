"""Batch-size control (seed 002): the concurrency limit in front of the engine, cut
by x0.8 (floor 8) after three consecutive 5 s windows with TTFT P99 over 500 ms, and
raised by x1.2 (cap 64) after a window in which requests waited for a slot while the
engine was busy under 60% of the time. It starts at 16. Seed 002 cuts only on consecutive breaches so that one slow request cannot
halve throughput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slo.policy.conditions import PolicyConfig


@dataclass(frozen=True, slots=True)
class LimitChange:
    old: int
    new: int
    reason: str
    details: dict


@dataclass(slots=True)
class BatchController:
    config: PolicyConfig
    limit: int = 0
    breaches: int = 0
    window_end: float | None = None
    saturated: bool = False  # requests waited for a slot during the current window

    def __post_init__(self) -> None:
        self.limit = self.limit or self.config.batch_initial

    def step(self, now: float, p99_s: float | None, utilisation: float,
             saturated: bool = True) -> LimitChange | None:
        """Call every evaluation; acts once per `batch_window_s` window with the
        window's P99 and utilisation. `saturated`: the limit held requests back in
        the window; raising a limit nobody waits on would only leave a larger one
        for the next surge to overrun."""
        c = self.config
        self.saturated |= saturated
        if self.window_end is None:
            self.window_end = now + c.batch_window_s
            return None
        if now < self.window_end:
            return None
        self.window_end = now + c.batch_window_s
        saturated, self.saturated = self.saturated, False
        details = {"p99_s": p99_s, "utilisation": utilisation, "breaches": self.breaches}
        if p99_s is not None and p99_s > c.batch_p99_s:
            self.breaches += 1
            details["breaches"] = self.breaches
            if self.breaches >= c.batch_windows:
                self.breaches = 0
                return self._set(max(c.batch_floor, int(self.limit * c.batch_cut)),
                                 f"TTFT P99 {p99_s:.3f} s > {c.batch_p99_s:g} s for "
                                 f"{c.batch_windows} windows", details)
            return None
        self.breaches = 0
        if saturated and utilisation < c.batch_low_utilisation and self.limit < c.batch_cap:
            return self._set(min(c.batch_cap, math.ceil(self.limit * c.batch_raise)),
                             f"utilisation {utilisation:.0%} < "
                             f"{c.batch_low_utilisation:.0%}", details)
        return None

    def _set(self, new: int, reason: str, details: dict) -> LimitChange | None:
        if new == self.limit:
            return None
        change = LimitChange(self.limit, new, reason, details)
        self.limit = new
        return change
