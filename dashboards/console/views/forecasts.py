"""Forecasts: the KV-cache forecast as served against what happened, with the 90%
line; predicted against actual latency; which models are live and how they scored, and
the latency predictor's last retrain decision (accepted or refused, and why)."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboards.console import charts, common, queries
from slo.predict import accuracy

DEFAULT_THRESHOLD = 0.9  # seed 002: scale out when the forecast passes 90%


def threshold(src) -> float:
    if not src.live:
        return DEFAULT_THRESHOLD
    return float(src.policies()["config"].get("memory", DEFAULT_THRESHOLD))


def memory_panel(src, minutes: int) -> None:
    st.subheader("KV-cache usage: forecast against actual")
    actual = src.query(queries.kv_actual(minutes))
    predicted = src.query(queries.kv_forecast(minutes))
    if actual.empty and predicted.empty:
        st.info("No engine seconds in this window yet.")
        return
    st.altair_chart(charts.forecast(actual, predicted, threshold(src)), width="stretch")
    st.caption("The forecast is drawn at the time it was made for, so where the lines "
               "part is where it was wrong.")


def models_panel(src) -> None:
    st.subheader("Live models")
    if not src.live:
        st.info(common.NEEDS_SERVER)
        return
    models = src.models()
    memory, latency = models["memory"], models["latency"]
    cols = st.columns(3)
    cols[0].metric("memory forecaster", memory["model"],
                   help="The backtest winner; last_value until a backtest has run.")
    forecast = memory.get("forecast")
    cols[1].metric(f"KV forecast in {memory['horizon_s'] / 60:g} min",
                   "-" if forecast is None else f"{forecast:.1%}")
    cols[2].metric("latency predictor", latency["version"])
    backtest = memory.get("backtest")
    if backtest:
        st.dataframe(pd.json_normalize(backtest), hide_index=True)
    else:
        st.caption("No backtest yet: it needs 40 min of engine history.")
    for name, model in models.items():
        if model.get("last_error"):
            st.error(f"{name} model: {model['last_error']}")
    if memory.get("forecast_at"):
        st.caption(f"Forecast refreshed {time.time() - memory['forecast_at']:.0f} s ago.")


def retrain_decision(src) -> None:
    """The latency predictor's last retrain decision, from the trace log: a candidate
    goes live only if it beats the live model on the newest requests."""
    last = src.query(queries.last_retrain())
    if last.empty:
        st.caption("Latency predictor: no retrain decision yet.")
        return
    row = last.iloc[0]
    when = pd.Timestamp(row["ts"]).tz_convert("UTC")
    ago = max(0.0, time.time() - when.timestamp())
    verdict, _, why = str(row["reason"]).partition(": ")
    colour = {"accepted": "green", "kept, not trained": "blue"}.get(verdict, "orange")
    st.markdown(f"**Last latency retrain** ({when:%Y-%m-%d %H:%M:%S} UTC, {ago / 60:.0f} min "
                f"ago, {row['trigger']}): :{colour}[{verdict}]: {why}")


def latency_panel(src, minutes: int) -> None:
    st.subheader("Predicted against actual latency")
    pairs = src.query(queries.predicted_vs_actual(minutes))
    if pairs.empty:
        st.info(common.NO_REQUESTS)
        return
    left, right = st.columns(2)
    left.altair_chart(charts.predicted_vs_actual(pairs, "ttft_s", "predicted_ttft_s", "TTFT"),
                      width="stretch")
    tpot = pairs[pairs["tpot_s"] > 0]
    if not tpot.empty:
        right.altair_chart(charts.predicted_vs_actual(tpot, "tpot_s", "predicted_tpot_s",
                                                      "TPOT"), width="stretch")
    st.caption("As served: each request was judged by the model live when it was admitted. "
               "A good p90 covers 85-95% of requests.")
    st.dataframe(src.query(queries.prediction_accuracy(minutes)), hide_index=True)
    st.caption("Per context bucket, the same rule (Prometheus: `tailguard_prediction_*`, "
               "alert TailguardPredictionCoverageLow):")
    st.dataframe(src.query(queries.prediction_accuracy_by_bucket(minutes)), hide_index=True)
    served, never = src.query(queries.never_predicted(minutes)).iloc[0]
    st.caption(accuracy.never_predicted_line(int(served), int(never)).capitalize()
               + ": not counted above.")


def render(src, minutes: int) -> None:
    memory_panel(src, minutes)
    models_panel(src)
    retrain_decision(src)
    latency_panel(src, minutes)


st.header("Forecasts")
common.run_page(render)
