"""tailguard ops console: live latency by context bucket and the trace log.

Run through `tailguard console` (or `tailguard up`), which sets TAILGUARD_URL and the
admin token for this process.
"""

from __future__ import annotations

import streamlit as st

from dashboards.console import queries
from dashboards.console.client import AdminClient, ConsoleError


def _client() -> AdminClient | None:
    try:
        return AdminClient.from_env()
    except ConsoleError as exc:
        st.error(str(exc))
        return None


def _latency_chart(frame):
    import altair as alt

    long = frame.melt(id_vars=["t", "context_bucket"], value_vars=["ttft_p50", "ttft_p99"],
                      var_name="percentile", value_name="seconds")
    return (alt.Chart(long).mark_line(point=True)
            .encode(x=alt.X("t:T", title="time"), y=alt.Y("seconds:Q", title="TTFT (s)"),
                    color=alt.Color("context_bucket:N", title="context"),
                    strokeDash=alt.StrokeDash("percentile:N"))
            .properties(height=280))


def live_page(client: AdminClient, minutes: int) -> None:
    by_time = client.query(queries.latency_over_time(minutes))
    if by_time.empty:
        st.info("No successful requests in this window yet. Send some load "
                "(`tailguard bench --url ...` or `tailguard up --demo`).")
    else:
        st.subheader("TTFT by context bucket")
        st.altair_chart(_latency_chart(by_time), width="stretch")
        st.dataframe(client.query(queries.latency_by_bucket(minutes)), hide_index=True)
    st.subheader("Outcomes")
    st.dataframe(client.query(queries.outcomes(minutes)), hide_index=True)
    st.subheader("Latest requests (trace log)")
    st.dataframe(client.query(queries.recent_requests()), hide_index=True)


def main() -> None:
    st.set_page_config(page_title="tailguard", layout="wide")
    st.title("tailguard")
    client = _client()
    if client is None:
        return
    window = st.sidebar.selectbox("Window", list(queries.WINDOWS), index=1)
    refresh = st.sidebar.slider("Auto-refresh (s, 0 = off)", 0, 60, 5)
    st.sidebar.caption(f"Server: {client.url}")

    @st.fragment(run_every=refresh or None)
    def live() -> None:
        try:
            live_page(client, queries.WINDOWS[window])
        except ConsoleError as exc:
            st.error(str(exc))

    live()


main()
