"""What every console page shares: the data source, the sidebar settings, auto-refresh
and how errors and empty panels are shown."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from dashboards.console.client import (
    AdminClient,
    ConsoleError,
    TraceFile,
    connect,
)
from dashboards.console.queries import WINDOWS
from observe import settings
from observe.settings import TAILGUARD_CONSOLE_REFRESH_S

DEFAULT_REFRESH_S = 5
WINDOW_KEY, REFRESH_KEY = "window", "refresh_s"

Source = AdminClient | TraceFile


def default_refresh_s() -> int:
    refresh_s = settings.number_or_default(TAILGUARD_CONSOLE_REFRESH_S, DEFAULT_REFRESH_S, int)
    return max(0, min(300, refresh_s))


def source() -> Source | None:
    try:
        return connect()
    except ConsoleError as exc:
        st.error(str(exc))
        return None


def sidebar(src: Source | None) -> None:
    """Settings every page reads (kept in session state across pages)."""
    st.sidebar.selectbox("Window", list(WINDOWS), index=1, key=WINDOW_KEY)
    st.sidebar.number_input("Auto-refresh (s, 0 = off)", 0, 300, default_refresh_s(), step=5,
                            key=REFRESH_KEY)
    if src is not None:
        st.sidebar.caption(f"Data: {src.where}")


def window_minutes() -> int:
    return WINDOWS[st.session_state.get(WINDOW_KEY, "15 min")]


def run_page(live: Callable[[Source, int], None] | None,
             static: Callable[[Source], None] | None = None) -> None:
    """Render `live` in an auto-refreshing fragment and `static` (forms, the SQL box:
    what an operator is typing into) once per interaction. Errors become messages."""
    src = source()
    if src is None:
        return
    if live is not None:
        refresh = st.session_state.get(REFRESH_KEY, default_refresh_s())

        @st.fragment(run_every=refresh or None)
        def fragment() -> None:
            shielded(live, src, window_minutes())

        fragment()
    if static is not None:
        shielded(static, src)


def shielded(render: Callable, *args) -> None:
    try:
        render(*args)
    except ConsoleError as exc:
        st.error(str(exc))


NO_REQUESTS = ("No requests in this window yet. Send some load (`tailguard bench --url ...` "
               "or `tailguard up --demo`) or widen the window.")
NEEDS_SERVER = "This panel needs a running server (the console is reading a trace file)."
