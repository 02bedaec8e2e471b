"""Policies: each degradation policy's state, why it is there and since when;
operator overrides (auto / force on / force off, with a required reason and an
optional TTL) through `PUT /admin/policies/{name}`; the audit log."""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import streamlit as st

from dashboards.console import common
from dashboards.console.client import ConsoleError
from slo.policy.conditions import BATCH_CONTROL
from slo.policy.lifecycle import ACTIVE, AUTO, FORCE_OFF, FORCE_ON, INACTIVE, RECOVERING

# Each override mode (defined in slo.policy.lifecycle) as the form shows it.
MODES = {AUTO: "auto", FORCE_ON: "force on", FORCE_OFF: "force off"}
MESSAGE_KEY = "policy_message"
EFFECTIVE_ICONS = {ACTIVE: "🔴 active", RECOVERING: "🟠 recovering", INACTIVE: "🟢 inactive"}


def _when(epoch: float | None) -> datetime | None:
    return None if not epoch else datetime.fromtimestamp(epoch, timezone.utc)


def effective_label(p: dict) -> str:
    """A policy's state as the table shows it. Batch control is a controller, always
    on: it shows its limit, in colour only while it has cut the limit below where it
    starts (TTFT P99 over its target), which is trouble; at rest or raised, no alarm."""
    if p["policy"] != BATCH_CONTROL or "limit" not in p:
        return EFFECTIVE_ICONS.get(p["effective"], p["effective"])
    if p["effective"] == INACTIVE:
        return f"⚪ forced off (limit {p['limit']})"
    limit, initial, cap = p["limit"], p.get("initial"), p.get("cap")
    if initial is not None and limit < initial:
        return f"🟠 limit {limit} (cut from {initial})"
    return f"⚙️ limit {limit}" + ("" if cap is None else f" (cap {cap})")


def state_table(policies: list[dict]) -> pd.DataFrame:
    rows = []
    for p in policies:
        o = p["override"] or {}
        rows.append({"policy": p["policy"], "effective": effective_label(p),
                     "machine state": p["state"], "mode": MODES[o.get("mode", AUTO)],
                     "reason": o.get("reason") if o.get("mode", AUTO) != AUTO
                     else p.get("reason"),
                     "last transition": _when(p["since"]),
                     "override by": o.get("actor"), "override expires": _when(o.get("expires"))})
    return pd.DataFrame(rows)


def render(src, minutes: int) -> None:
    if not src.live:
        st.info(common.NEEDS_SERVER + " Below: the transitions and overrides it recorded.")
        st.dataframe(src.query("SELECT * FROM policy_events ORDER BY ts DESC LIMIT 200"),
                     hide_index=True)
        st.dataframe(src.query("SELECT * FROM overrides ORDER BY created_ts DESC LIMIT 200"),
                     hide_index=True)
        return
    data = src.policies()
    st.dataframe(state_table(data["policies"]), hide_index=True)
    signals = data.get("signals") or {}
    limiter = data["limiter"]
    st.caption(signals_caption(signals, limiter))


def signals_caption(signals: dict, limiter: dict) -> str:
    """What the policies read now. A signal the server reports as null (no samples
    yet: no finished request in the window, no forecast made) reads "-", never 0."""
    def shown(key: str, spec: str, unit: str = "") -> str:
        value = signals.get(key)
        return "-" if value is None else f"{value:{spec}}{unit}"

    return (f"Signals: P99 {shown('p99_s', '.3f', ' s')}, load {shown('load', '.0%')}, "
            f"KV {shown('kv_usage', '.0%')} (forecast {shown('kv_forecast', '.0%')}), "
            f"queue {signals.get('queue_depth', 0)}; limiter {limiter['in_flight']}/"
            f"{limiter['limit']} in flight, {limiter['waiting']} waiting{_gate(limiter)}.")


def _gate(limiter: dict) -> str:
    """The prefill gate, when one is in force (prompt tokens in the engine not yet
    prefilled against what it lets in), the KV-cache reserve kept for VIPs (against
    what the cache has free), the refused requests booked to retry, and the requests
    kept in front so as not to make an earlier one late (promises kept)."""
    gate, booked = limiter.get("prefill_gate_tokens"), limiter.get("retry_bookings")
    reserve = limiter.get("vip_kv_reserve_tokens")
    text = "" if gate is None else \
        f"; prefill gate {limiter.get('engine_prefill_tokens', 0)}/{gate} tokens"
    if reserve is not None:
        free = limiter.get("kv_free_tokens", 0)
        text += f"; KV cache {free} tokens free, {reserve} kept for VIPs"
    held = limiter.get("promise_holds")
    text += f"; {held} requests kept in front for an earlier one's deadline" if held else ""
    return text + (f"; {booked} refused requests booked to retry" if booked else "")


def _apply(src, name: str) -> None:
    """Form callback: runs before the page, so the table below shows the new state."""
    mode = st.session_state[f"mode-{name}"]
    reason = st.session_state[f"reason-{name}"].strip()
    ttl_min = st.session_state[f"ttl-{name}"]
    if not reason:
        st.session_state[MESSAGE_KEY] = ("error", f"{name}: an override needs a reason.")
        return
    try:
        result = src.set_policy(name, mode, reason, ttl_min * 60 or None)
    except ConsoleError as exc:
        st.session_state[MESSAGE_KEY] = ("error", f"{name}: {exc}")
        return
    st.session_state[f"reason-{name}"] = ""
    st.session_state[MESSAGE_KEY] = ("success", f"{name}: {MODES[mode]} (effective now: "
                                                f"{result['effective']}).")


def override_forms(src) -> None:
    st.subheader("Overrides")
    for p in src.policies()["policies"]:
        name, current = p["policy"], (p["override"] or {}).get("mode", AUTO)
        _follow_server(name, current)
        with st.form(f"override-{name}", border=True):
            cols = st.columns([2, 4, 5, 2, 1.4], vertical_alignment="bottom")
            cols[0].markdown(f"**{name}**  \n{effective_label(p)}")
            cols[1].radio("Mode", list(MODES), format_func=MODES.get, horizontal=True,
                          key=f"mode-{name}")
            cols[2].text_input("Reason (required)", key=f"reason-{name}")
            cols[3].number_input("TTL (min, 0 = none)", 0, 24 * 60, 0, key=f"ttl-{name}")
            cols[4].form_submit_button("Apply", on_click=_apply, args=(src, name))


def _follow_server(name: str, current: str) -> None:
    """The mode selector shows the server's mode whenever that changed since the page
    last saw it (an override expired, another operator set one): Streamlit keeps a
    widget's own session value and ignores `index=`, so an expired override's mode
    would stay selected."""
    seen = f"mode-seen-{name}"
    if st.session_state.get(seen) != current:
        st.session_state[f"mode-{name}"] = current
        st.session_state[seen] = current


def audit(src) -> None:
    st.subheader("Audit log")
    data = src.audit()
    st.caption("Overrides (who, when, why, mode, expiry), newest first")
    if data["overrides"]:
        st.dataframe(pd.DataFrame(data["overrides"]), hide_index=True)
    else:
        st.info("No override has been set on this server.")
    st.caption("Policy transitions, newest first")
    if data["events"]:
        st.dataframe(pd.DataFrame(data["events"]), hide_index=True)
    else:
        st.info("No policy has moved yet.")


def static(src) -> None:
    if src.live:
        override_forms(src)
        audit(src)


st.header("Policies")
if MESSAGE_KEY in st.session_state:
    kind, text = st.session_state.pop(MESSAGE_KEY)
    (st.error if kind == "error" else st.success)(text)
common.run_page(render, static=static)
