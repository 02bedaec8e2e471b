"""tailguard ops console: a Streamlit multipage app over a running server's admin API
(or, with no server, a trace file opened read-only).

Run through `tailguard console` (or `tailguard up`), which sets the server URL, the
admin token and the refresh interval for this process.
"""

from __future__ import annotations

import streamlit as st

from dashboards.console import common
from dashboards.console.client import ConsoleError, connect

PAGES = (("views/overview.py", "Overview", ":material/monitor_heart:"),
         ("views/latency.py", "Latency", ":material/timer:"),
         ("views/traces.py", "Traces", ":material/manage_search:"),
         ("views/forecasts.py", "Forecasts", ":material/trending_up:"),
         ("views/policies.py", "Policies", ":material/tune:"))


def main() -> None:
    st.set_page_config(page_title="tailguard", page_icon=":material/shield:", layout="wide")
    navigation = st.navigation([st.Page(path, title=title, icon=icon, default=i == 0)
                                for i, (path, title, icon) in enumerate(PAGES)])
    st.sidebar.title("tailguard")
    try:
        src = connect()
    except ConsoleError:
        src = None  # the page says why
    common.sidebar(src)
    navigation.run()


main()
