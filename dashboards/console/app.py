"""tailguard ops console: a Streamlit multipage app over a running server's admin API
(or, with no server, a trace file opened read-only).

Run through `tailguard console` (or `tailguard up`), which sets the server URL, the
admin token and the refresh interval for this process. Off loopback (or with
`--console-auth always`) the login gate below runs before `st.navigation`, so no page,
sidebar or data renders until the console password is given (`auth.py`).
"""

from __future__ import annotations

import streamlit as st

from dashboards.console import common
from dashboards.console.auth import Access
from dashboards.console.client import ConsoleError, access, connect
from observe.settings import TAILGUARD_ADMIN_TOKEN

PAGES = (("views/overview.py", "Overview", ":material/monitor_heart:"),
         ("views/latency.py", "Latency", ":material/timer:"),
         ("views/traces.py", "Traces", ":material/manage_search:"),
         ("views/forecasts.py", "Forecasts", ":material/trending_up:"),
         ("views/policies.py", "Policies", ":material/tune:"))
SESSION_KEY, PASSWORD_KEY, FAILED_KEY = "console_session", "console_password", "login_failed"
NO_TOKEN = (f"This console is reachable beyond this machine and has no admin token to "
            f"check a password against: set ${TAILGUARD_ADMIN_TOKEN} or --token-file.")
WRONG = "Wrong password."


def _sign_in(rule: Access) -> None:
    """Form callback: check the password, then forget it (the widget is cleared)."""
    typed = st.session_state.get(PASSWORD_KEY) or ""
    st.session_state[PASSWORD_KEY] = ""
    if rule.check(typed):
        st.session_state[SESSION_KEY] = rule.session_mark()
        st.session_state.pop(FAILED_KEY, None)
    else:
        st.session_state[FAILED_KEY] = True


def _sign_out() -> None:
    st.session_state.pop(SESSION_KEY, None)


def login_form(rule: Access) -> None:
    st.title("tailguard")
    if st.session_state.get(FAILED_KEY):
        st.error(WRONG)
    with st.form("login"):
        st.text_input("Console password", type="password", key=PASSWORD_KEY)
        st.form_submit_button("Sign in", on_click=_sign_in, args=(rule,))
    st.caption("The console password is derived from the admin token; "
               "`tailguard console --print-password` prints it.")


def gate() -> Access | None:
    """The access rule when this session may see the pages; otherwise None, having
    said why not or shown the login form."""
    try:
        rule = access(st.get_option("server.address"))
    except ConsoleError as exc:
        st.error(str(exc))
        return None
    if not rule.login_required or rule.signed_in(st.session_state.get(SESSION_KEY)):
        return rule
    if rule.token:
        login_form(rule)
    else:
        st.error(NO_TOKEN)
    return None


def main() -> None:
    st.set_page_config(page_title="tailguard", page_icon=":material/shield:", layout="wide")
    rule = gate()
    if rule is None:
        return
    navigation = st.navigation([st.Page(path, title=title, icon=icon, default=i == 0)
                                for i, (path, title, icon) in enumerate(PAGES)])
    st.sidebar.title("tailguard")
    try:
        src = connect()
    except ConsoleError:
        src = None  # the page says why
    common.sidebar(src)
    if rule.login_required:
        st.sidebar.button("Sign out", on_click=_sign_out)
    navigation.run()


main()
