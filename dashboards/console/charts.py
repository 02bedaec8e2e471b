"""The console's Altair charts: each takes a DataFrame from `queries` and returns a chart."""

from __future__ import annotations

import altair as alt

from observe.registry import SPAN_DECODE, SPAN_PREFILL, SPAN_QUEUE, SPAN_REQUEST, SPAN_SAMPLING

HEIGHT = 280
# One time convention, the tables': UTC on a 24-hour clock (Vega-Lite otherwise draws a
# time axis in the browser's local zone).
TIME_X = alt.X("t:T", title="time (UTC)", scale=alt.Scale(type="utc"),
               axis=alt.Axis(format="%H:%M"))
TIME_TIP = alt.Tooltip("t:T", title="time (UTC)", formatType="utc", format="%Y-%m-%d %H:%M:%S")
FLOW_COLORS = {"requests_per_s": "#7f7f7f", "goodput_per_s": "#2ca02c",
               "failed_per_s": "#d62728"}
PHASE_COLORS = {SPAN_REQUEST: "#9e9e9e", SPAN_QUEUE: "#f2a93b", SPAN_PREFILL: "#4c78a8",
                SPAN_DECODE: "#54a24b", SPAN_SAMPLING: "#b279a2"}


def percentiles(frame, title: str) -> alt.Chart:
    return (alt.Chart(frame).mark_line(point=True)
            .encode(x=TIME_X,
                    y=alt.Y("seconds:Q", title=f"{title} (s)"),
                    color=alt.Color("context_bucket:N", title="context"),
                    strokeDash=alt.StrokeDash("percentile:N", title="percentile"),
                    tooltip=[TIME_TIP, "context_bucket:N", "percentile:N",
                             alt.Tooltip("seconds:Q", format=".4f")])
            .properties(height=HEIGHT))


def context_shares(frame) -> alt.Chart:
    return (alt.Chart(frame).mark_bar()
            .encode(x=alt.X("tokens_from:O", title="prompt tokens (from)"),
                    xOffset="period:N",
                    y=alt.Y("share:Q", title="share of requests", axis=alt.Axis(format="%")),
                    color=alt.Color("period:N", title="period"),
                    tooltip=["period:N", "tokens_from:O", "requests:Q",
                             alt.Tooltip("share:Q", format=".1%")])
            .properties(height=HEIGHT))


def length_bounds(frame) -> alt.Chart:
    """Seed 000's two length-class boundaries over time (prompt tokens)."""
    return (alt.Chart(frame).mark_line(point=True, interpolate="step-after")
            .encode(x=TIME_X, y=alt.Y("tokens:Q", title="boundary (prompt tokens)"),
                    color=alt.Color("bound:N", title="boundary"),
                    tooltip=[TIME_TIP, "bound:N", "tokens:Q"])
            .properties(height=220))


def throughput(frame) -> alt.Chart:
    long = frame.melt(id_vars=["t"], var_name="series", value_name="per_s")
    return (alt.Chart(long).mark_line(point=True)
            .encode(x=TIME_X, y=alt.Y("per_s:Q", title="requests/s"),
                    color=alt.Color("series:N", title="", scale=alt.Scale(
                        domain=list(FLOW_COLORS), range=list(FLOW_COLORS.values()))),
                    tooltip=[TIME_TIP, "series:N", alt.Tooltip("per_s:Q", format=".3f")])
            .properties(height=220))


def burn_heatmap(frame) -> alt.Chart:
    """SLO x window, coloured by burn rate (1x = spending the budget exactly on time)."""
    base = alt.Chart(frame).encode(x=alt.X("window:N", sort=None, title="window"),
                                   y=alt.Y("slo:N", title=""))
    cells = base.mark_rect().encode(
        color=alt.Color("burn_rate:Q", title="burn rate",
                        scale=alt.Scale(domain=[0, 1, 6, 14.4], range=[
                            "#2ca02c", "#c7e9c0", "#fdae6b", "#d62728"], clamp=True)))
    labels = base.mark_text(fontSize=12).encode(text=alt.Text("burn_rate:Q", format=".2f"))
    return (cells + labels).properties(height=36 * max(1, frame["slo"].nunique()))


def waterfall(frame) -> alt.Chart:
    return (alt.Chart(frame).mark_bar()
            .encode(y=alt.Y("phase:N", sort=None, title=""),
                    x=alt.X("start_s:Q", title="seconds since the request arrived"),
                    x2="end_s:Q",
                    color=alt.Color("phase:N", legend=None, scale=alt.Scale(
                        domain=list(PHASE_COLORS), range=list(PHASE_COLORS.values()))),
                    tooltip=["phase:N", alt.Tooltip("start_s:Q", format=".4f"),
                             alt.Tooltip("duration_s:Q", format=".4f")])
            .properties(height=40 * max(2, len(frame))))


def forecast(actual, predicted, threshold: float) -> alt.Chart:
    """KV-cache usage as it was, the forecast drawn at the time it was for, and the
    line above which the memory_pressure policy acts (seed 002: act above 90%)."""
    import pandas as pd

    both = pd.concat([actual.assign(series="actual"),
                      predicted[["t", "value"]].assign(series="forecast")])
    lines = (alt.Chart(both).mark_line()
             .encode(x=TIME_X,
                     y=alt.Y("value:Q", title="KV-cache usage", axis=alt.Axis(format="%"),
                             scale=alt.Scale(domain=[0, 1])),
                     color=alt.Color("series:N", title=""),
                     strokeDash=alt.StrokeDash("series:N", legend=None),
                     tooltip=[TIME_TIP, "series:N", alt.Tooltip("value:Q", format=".1%")]))
    rule = alt.Chart(pd.DataFrame({"y": [threshold]})).mark_rule(color="red").encode(y="y:Q")
    label = (alt.Chart(pd.DataFrame({"y": [threshold], "text": [f"{threshold:.0%} line"]}))
             .mark_text(align="left", dy=-6, color="red").encode(y="y:Q", text="text:N"))
    return (lines + rule + label).properties(height=HEIGHT)


def predicted_vs_actual(frame, actual: str, predicted: str, title: str) -> alt.Chart:
    """Log-log scatter with the y = x line: points above it were slower than predicted."""
    import pandas as pd

    low = float(min(frame[actual].min(), frame[predicted].min()))
    high = float(max(frame[actual].max(), frame[predicted].max()))
    scale = alt.Scale(type="log", domain=[low, high])
    points = (alt.Chart(frame).mark_circle(size=24, opacity=0.5)
              .encode(x=alt.X(f"{predicted}:Q", title=f"predicted {title} (s)", scale=scale),
                      y=alt.Y(f"{actual}:Q", title=f"actual {title} (s)", scale=scale),
                      color=alt.Color("predictor_version:N", title="model"),
                      tooltip=[alt.Tooltip(f"{predicted}:Q", format=".4f"),
                               alt.Tooltip(f"{actual}:Q", format=".4f"), "predictor_version:N"]))
    diagonal = (alt.Chart(pd.DataFrame({"x": [low, high], "y": [low, high]}))
                .mark_line(color="gray", strokeDash=[4, 4]).encode(x="x:Q", y="y:Q"))
    return (points + diagonal).properties(height=HEIGHT)
