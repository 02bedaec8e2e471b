"""Red / amber / green for an SLO, from the same burn-rate windows the alerts use:
red when a page alert's long and short windows both burn above its factor (or the
budget is spent), amber for a ticket alert (or under half the budget left), green
otherwise, grey with no events. The console shows what the pager would say."""

from __future__ import annotations

from slo.durations import parse_duration
from slo.windows import BURN_WINDOWS

GREEN, AMBER, RED, GREY = "green", "amber", "red", "grey"
COLORS = {GREEN: "green", AMBER: "orange", RED: "red", GREY: "gray"}  # Streamlit colours
LOW_BUDGET = 0.5


def firing(slo: dict) -> list[str]:
    """The burn-rate alerts (severity, long/short) this SLO status would fire."""
    period_s = parse_duration(slo["period"])
    burn = {w["window"]: w.get("burn_rate") for w in slo["windows"]}
    out = []
    for window in BURN_WINDOWS:
        factor = window.factor(period_s)
        long, short = burn.get(window.long), burn.get(window.short)
        if long is not None and short is not None and long >= factor and short >= factor:
            out.append(f"{window.severity} {window.long}/{window.short} > {factor:g}x")
    return out


def health(slo: dict) -> str:
    events = sum(w.get("events", 0) for w in slo["windows"] if w["window"] == slo["period"])
    if not events:
        return GREY
    alerts = firing(slo)
    budget = slo.get("budget_remaining")
    if any(a.startswith("page") for a in alerts) or (budget is not None and budget <= 0):
        return RED
    if alerts or (budget is not None and budget < LOW_BUDGET):
        return AMBER
    return GREEN


def worst(states: list[str]) -> str:
    order = (RED, AMBER, GREEN, GREY)
    return min(states, key=order.index) if states else GREY
