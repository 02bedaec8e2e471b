"""Latency: TTFT / TPOT / end-to-end percentiles over time per context bucket, and the
context-length mix now against the last hour and day (seed 002's first check when
P99 jumps: did the prompts get longer?), and seed 000's live length classes."""

from __future__ import annotations

import streamlit as st

from dashboards.console import charts, common, queries

METRIC_KEY = "latency_metric"


def render(src, minutes: int) -> None:
    label = st.session_state.get(METRIC_KEY, "TTFT")
    over_time = src.query(queries.percentiles_over_time(minutes, queries.METRICS[label]))
    st.subheader(f"{label} P50 / P95 / P99 by context bucket")
    if over_time.empty:
        st.info(common.NO_REQUESTS)
    else:
        st.altair_chart(charts.percentiles(over_time, label), width="stretch")
        st.dataframe(src.query(queries.latency_by_bucket(minutes)), hide_index=True)
    st.subheader("Context length: now against the last hour and day")
    shares = src.query(queries.context_distribution())
    if shares.empty:
        st.info("No requests in the last day yet.")
    else:
        st.altair_chart(charts.context_shares(shares), width="stretch")
    st.subheader("Length classes (seed 000: re-bucketed every 5 s from p25 / p75)")
    bounds = src.query(queries.length_bounds_over_time(minutes))
    if bounds.empty:
        st.info(common.NO_REQUESTS)
    else:
        st.altair_chart(charts.length_bounds(bounds), width="stretch")
        st.dataframe(src.query(queries.length_classes(minutes)), hide_index=True)
    st.subheader("Outcomes")
    st.dataframe(src.query(queries.outcomes(minutes)), hide_index=True)


st.header("Latency")
st.radio("Metric", list(queries.METRICS), horizontal=True, key=METRIC_KEY)
common.run_page(render)
