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


# The server's own event loop (GET /admin/policies `event_loop_lag`): every request
# waits behind whatever holds it. Healthy under 1 ms at p99; over 5 ms it is adding
# to the tail the SLOs measure (the targets issue 20 of the project set).
LOOP_LAG_OK_S = 0.001
LOOP_LAG_BAD_S = 0.005


def loop_lag(lag: dict | None) -> tuple[str, str]:
    """(state, one line) for the event-loop lag summary; grey without samples."""
    if not lag or not lag.get("samples"):
        return GREY, "Server event loop: no lag samples yet."
    p99 = lag["p99_s"]
    state = GREEN if p99 <= LOOP_LAG_OK_S else AMBER if p99 <= LOOP_LAG_BAD_S else RED
    return state, (f"Server event loop lag, last minute: p99 {p99 * 1000:.1f} ms, max "
                   f"{lag['max_s'] * 1000:.1f} ms ({lag['samples']} samples); worst since "
                   f"start {lag['worst_s'] * 1000:.0f} ms.")
