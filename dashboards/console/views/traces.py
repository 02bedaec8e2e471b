"""Traces: read-only SQL over the trace log (examples, result, CSV), a request's
waterfall (queue / prefill / decode / sampling) and the slowest requests."""

from __future__ import annotations

import streamlit as st

from dashboards.console import charts, common, queries
from dashboards.console.client import ConsoleError

EXAMPLE_KEY, SQL_KEY, RESULT_KEY, REQUEST_KEY = "example", "sql", "sql_result", "request_id"


def _load_example() -> None:
    st.session_state[SQL_KEY] = queries.EXAMPLES[st.session_state[EXAMPLE_KEY]]


def sql_box(src) -> None:
    st.subheader("SQL (read-only)")
    st.selectbox("Example queries", list(queries.EXAMPLES), key=EXAMPLE_KEY,
                 on_change=_load_example)
    if SQL_KEY not in st.session_state:
        _load_example()
    st.text_area("Query", key=SQL_KEY, height=120,
                 help="Tables: requests, spans, engine_stats, policy_events, overrides, "
                      "forecasts (docs/trace-log.md). Writes are refused.")
    if st.button("Run query", type="primary"):
        try:
            st.session_state[RESULT_KEY] = src.query(st.session_state[SQL_KEY])
        except ConsoleError as exc:
            st.session_state.pop(RESULT_KEY, None)
            st.error(f"Query refused: {exc}")
    result = st.session_state.get(RESULT_KEY)
    if result is not None:
        st.caption(f"{len(result)} rows")
        if result.attrs.get("truncated_by"):
            st.warning(_cut_short(len(result), result.attrs["truncated_by"]))
        st.dataframe(result, hide_index=True)
        st.download_button("Download CSV", result.to_csv(index=False).encode(),
                           file_name="tailguard-query.csv", mime="text/csv")


def _cut_short(rows: int, by: str) -> str:
    limit = f"{rows:,} rows" if by == "max_rows" else "the answer's size limit"
    return (f"Only the first {rows:,} rows are shown: the answer stopped at {limit}, and "
            "the CSV holds these rows only. Aggregate, or add a WHERE or LIMIT.")


def request_waterfall(src, request_id: str) -> None:
    try:
        spans = src.query(queries.waterfall(request_id))
    except ValueError as exc:
        st.error(str(exc))
        return
    if spans.empty:
        st.info(f"No spans for request {request_id} (rejected before the engine, or "
                "not flushed yet).")
    else:
        st.altair_chart(charts.waterfall(spans), width="stretch")
    row = src.query(queries.request_row(request_id))
    if not row.empty:
        st.dataframe(row.T.astype(str).rename(columns={0: request_id}), width="stretch")


def render(src, minutes: int) -> None:
    slowest = src.query(queries.slowest_requests(minutes))
    st.subheader("Request waterfall")
    chosen = st.session_state.get(REQUEST_KEY, "").strip()
    if not chosen and not slowest.empty:
        chosen = slowest["request_id"].iloc[0]
        st.caption("Showing the slowest request of the window; enter any request id above.")
    if chosen:
        request_waterfall(src, chosen)
    st.subheader("Slowest requests of the window")
    if slowest.empty:
        st.info(common.NO_REQUESTS)
    else:
        st.dataframe(slowest, hide_index=True)


st.header("Traces")
st.text_input("Request id (X-Request-Id)", key=REQUEST_KEY,
              placeholder="empty: the slowest request of the window")
common.run_page(render, static=sql_box)
