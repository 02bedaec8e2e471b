"""Multi-window, multi-burn-rate alerting (Google SRE workbook; Sloth's defaults),
kept as data: each alert consumes a share of the period's error budget over a long
window, checked against a short window to reset fast. The burn-rate factor is
derived from the period, never hard-coded: factor = budget share * period / long.
For a 30-day period that gives Sloth's 14.4, 6, 3 and 1."""

from __future__ import annotations

from dataclasses import dataclass

from slo.durations import format_duration, parse_duration


@dataclass(frozen=True, slots=True)
class BurnWindow:
    severity: str  # "page" or "ticket"
    long: str
    short: str
    budget_share: float  # fraction of the period's budget burnt over `long`

    @property
    def long_s(self) -> int:
        return parse_duration(self.long)

    @property
    def short_s(self) -> int:
        return parse_duration(self.short)

    def factor(self, period_s: int) -> float:
        return round(self.budget_share * period_s / self.long_s, 6)


BURN_WINDOWS = (
    BurnWindow("page", "1h", "5m", 0.02),
    BurnWindow("page", "6h", "30m", 0.05),
    BurnWindow("ticket", "1d", "2h", 0.10),
    BurnWindow("ticket", "3d", "6h", 0.10),
)


def sli_windows(period_s: int) -> tuple[str, ...]:
    """Every window a rate is needed over: the burn windows plus the period, sorted."""
    seconds = {w.long_s for w in BURN_WINDOWS} | {w.short_s for w in BURN_WINDOWS} | {period_s}
    return tuple(format_duration(s) for s in sorted(seconds))
