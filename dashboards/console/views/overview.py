"""Overview: every SLO at a glance (attainment, budget, burn rates, red/amber/green),
goodput, which degradation policies are acting now, and per client (tenant) who was
protected and who paid."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards.console import charts, common, queries
from dashboards.console.health import COLORS, firing, health, loop_lag, worst
from slo.policy.conditions import BATCH_CONTROL
from slo.policy.lifecycle import AUTO, INACTIVE
from slo.report import SHOWN_WINDOWS

CARDS_PER_ROW = 4  # wider cards cut the numbers off at laptop widths


def policy_banner(src) -> None:
    if not src.live:
        st.caption(common.NEEDS_SERVER + " Active policies are not shown.")
        return
    data = src.policies()
    acting = [p for p in data["policies"] if p["effective"] != INACTIVE
              and p["policy"] != BATCH_CONTROL]
    forced = [p["policy"] for p in data["policies"]
              if p["override"] and p["override"]["mode"] != AUTO]
    if acting:
        st.warning("Active policies: " + ", ".join(
            f"**{p['policy']}** ({p['effective']}{', forced' if p['policy'] in forced else ''})"
            for p in acting) + f"; concurrency limit {data['decisions']['concurrency_limit']}.")
    else:
        st.success("No degradation policy is acting; concurrency limit "
                   f"{data['decisions']['concurrency_limit']}.")
    if forced:
        st.caption("Operator overrides in force: " + ", ".join(forced))
    state, line = loop_lag(data.get("event_loop_lag"))
    st.caption(f":{COLORS[state]}[●] {line}")  # the dot's colour says how it stands


def slo_cards(slos: list[dict]) -> None:
    overall = [s for s in slos if not s["group"]]
    for i, slo in enumerate(overall):
        if i % CARDS_PER_ROW == 0:
            columns = st.columns(CARDS_PER_ROW)
        state = health(slo)
        with columns[i % CARDS_PER_ROW].container(border=True):
            st.markdown(f":{COLORS[state]}[●] **{slo['name']}**  ·  objective "
                        f"{slo['objective']:.2%}")
            attainment = slo["attainment"]
            budget = slo["budget_remaining"]
            st.metric("attainment", "-" if attainment is None else f"{attainment:.3%}",
                      delta=None if budget is None else f"{budget:.1%} budget left")
            alerts = firing(slo)
            st.caption(", ".join(alerts) if alerts else "no burn-rate alert firing")


def burn_frame(slos: list[dict], grouped: bool) -> pd.DataFrame:
    rows = []
    for slo in slos:
        if bool(slo["group"]) != grouped:
            continue
        label = slo["name"] + ("" if not slo["group"] else " · " + ", ".join(
            f"{k}={v}" for k, v in slo["group"].items()))
        for w in slo["windows"]:
            if w["window"] in SHOWN_WINDOWS and w["burn_rate"] is not None:
                rows.append({"slo": label, "window": w["window"],
                             "burn_rate": w["burn_rate"], "events": w["events"]})
    return pd.DataFrame(rows, columns=["slo", "window", "burn_rate", "events"])


def group_table(slos: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"slo": s["name"], **s["group"], "health": health(s),
                          "attainment": s["attainment"], "budget_left": s["budget_remaining"]}
                         for s in slos if s["group"]])


def render(src, minutes: int) -> None:
    status = src.slo()
    slos = status["slos"]
    overall = worst([health(s) for s in slos if not s["group"]])
    st.header(f":{COLORS[overall]}[●] Overview")
    policy_banner(src)
    if not any(w["events"] for s in slos for w in s["windows"]):
        st.info(common.NO_REQUESTS)
        return
    slo_cards(slos)
    goodput = status["goodput_rps"]
    cols = st.columns(3)
    for col, window in zip(cols, ("5m", "1h", "1d")):
        col.metric(f"goodput {window}", f"{goodput.get(window, 0):.3f} req/s",
                   help="Requests per second that met every SLO.")
    st.subheader("Burn rates per window")
    st.altair_chart(charts.burn_heatmap(burn_frame(slos, grouped=False)), width="stretch")
    st.subheader("Requests and goodput")
    flow = src.query(queries.throughput_over_time(minutes))
    if flow.empty:
        st.info(common.NO_REQUESTS)
    else:
        st.altair_chart(charts.throughput(flow), width="stretch")
    with st.expander("By context bucket and priority"):
        st.dataframe(group_table(slos), hide_index=True)
    tenant_table(src, minutes)


def tenant_table(src, minutes: int) -> None:
    """Who was protected and who paid: per client (API key name) over the window."""
    st.subheader("Tenants")
    tenants = src.tenants(minutes)
    if not tenants:
        st.info(common.NO_REQUESTS)
        return
    st.caption(f"Per client (API key name) over the last {minutes} min: attainment is the "
               "share of served requests within every SLO, goodput those per second, shed "
               "the requests a policy or admission refused.")
    st.dataframe(pd.DataFrame(tenants), hide_index=True)


common.run_page(render)
