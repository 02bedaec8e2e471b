"""Burn-rate scenarios for the generated alert tests, and their expected outcome.

A scenario is a share of bad events per minute. Its shares sit between the burn
thresholds (factor x budget) of `slo.windows`, so the same scenarios hold for any
period (a 28d SLO pages at 13.44x, not 14.4x), and together they pin each window:
each factor, and that the long and the short window must both exceed it.
`burn_outcome` models the alert expression (the mean bad share over each window
against its threshold) to confirm what a scenario's name says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from alerts.slo_rules import SEVERITIES, error_budget
from slo.spec import SLO
from slo.windows import BURN_WINDOWS

MARGIN = 0.1  # a window's ratio must be >10% away from its threshold to be judged
MINUTES = 10  # length of the constant-burn scenarios (the 5m window is full)
BURST_AFTER = 55  # clean minutes before the burst: it ends at 1 h


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str  # a sentence: what happens
    profile: tuple[float, ...]  # share of bad events in each minute
    expect: tuple[str, ...]  # severities that fire at the end


def scenarios(slo: SLO) -> list[Scenario]:
    """The alert scenarios that are feasible (shares <= 1) for `slo`."""
    budget, period = error_budget(slo), slo.window_s
    low = SEVERITIES[-1]
    w1, w2, _, w4 = BURN_WINDOWS  # Sloth's shape: two page windows, then two ticket
    f1, f2, f3, f4 = (w.factor(period) * budget for w in BURN_WINDOWS)
    clean = max(w1.short_s, w2.short_s) // 60 + 5
    fast = 2 * max(f1, f2, f3, f4)
    candidates = [
        Scenario("a constant fast burn pages and opens a ticket", (fast,) * MINUTES, SEVERITIES),
        Scenario("a slow burn opens a ticket but does not page",
                 (math.sqrt(f3 * f2),) * MINUTES, (low,)),
        Scenario("a burn within the budget is silent", (0.5 * min(f1, f2, f3, f4),) * MINUTES, ()),
        Scenario(f"a {w1.short} burst after {BURST_AFTER} clean minutes opens a ticket"
                 " but does not page",
                 (0.0,) * BURST_AFTER + (3 * f1,) * (w1.short_s // 60), (low,)),
        Scenario(f"a page stops once the last {clean} minutes are clean (the ticket stays)",
                 (4 * f1,) * clean + (0.0,) * clean, (low,)),
        Scenario(f"a burn, a pause and a {w1.short} spike page through the {w1.long}"
                 " window alone", _spike(w1, w2, 2 * f1, 2.1 * f1), SEVERITIES),
        Scenario(f"a steady burn between the two page factors pages through the {w2.long}"
                 " window", (math.sqrt(f1 * f2),) * MINUTES, SEVERITIES),
        Scenario(f"a steady burn between the two ticket factors opens a ticket through the"
                 f" {w4.long} window", (math.sqrt(f3 * f4),) * MINUTES, (low,)),
    ]
    return [s for s in candidates if max(s.profile) <= 1]


def _spike(w1, w2, burn: float, spike: float) -> tuple[float, ...]:
    """Half of w1's long window at `burn`, a pause, then w1's short window at `spike`:
    hot over w1's long and short windows, cool over w2's short one."""
    half, pause = w2.short_s // 60, (w2.short_s - w1.short_s) // 60
    return (burn,) * half + (0.0,) * pause + (spike,) * (w1.short_s // 60)


def window_ratio(profile: tuple[float, ...], minutes: int, exclusive: bool) -> float | None:
    """Mean bad share seen by a `[minutes]` rate at the end of `profile`, samples each
    minute; Prometheus 2 includes the sample at the window's start, 3 does not."""
    end = len(profile)
    start = max(0, end - minutes + (1 if exclusive else 0))
    shares = profile[start:end]
    return sum(shares) / len(shares) if shares else None


def burn_outcome(scenario: Scenario, slo: SLO) -> set[str] | None:
    """Severities firing at the scenario's end, or None when a ratio is too close to
    its threshold or the two ways of bounding a rate window disagree."""
    outcomes = [_outcome(scenario.profile, slo, exclusive) for exclusive in (False, True)]
    return outcomes[0] if outcomes[0] == outcomes[1] else None


def _outcome(profile, slo: SLO, exclusive: bool) -> set[str] | None:
    budget, fired = error_budget(slo), set()
    for window in BURN_WINDOWS:
        threshold = window.factor(slo.window_s) * budget
        short = window_ratio(profile, window.short_s // 60, exclusive)
        long = window_ratio(profile, window.long_s // 60, exclusive)
        if any(r is not None and abs(r - threshold) <= MARGIN * threshold for r in (short, long)):
            return None
        if short is not None and long is not None and short > threshold and long > threshold:
            fired.add(window.severity)
    return fired
