"""The SQL behind the console's panels, one function per question. Everything goes
through the read-only `/admin/query` (or a read-only trace file), so each is plain text.
"""

from __future__ import annotations

import re

from observe.registry import PHASE_SPANS, SPAN_REQUEST
from slo.predict.accuracy import GATE_EVENT, never_predicted_sql, served_accuracy_sql

WINDOWS = {"5 min": 5, "15 min": 15, "1 hour": 60, "6 hours": 360, "1 day": 1440}
METRICS = {"TTFT": "ttft_s", "TPOT": "tpot_s", "end to end": "e2e_s"}
PERCENTILES = (0.5, 0.95, 0.99)
# Seed 002's first question when P99 jumps: did the context lengths change?
CONTEXT_PERIODS = {"last 5 min": 5, "last hour": 60, "last day": 1440}
PHASES = PHASE_SPANS  # queue, prefill, decode, sampling: the waterfall's bars
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def _since(minutes: int, column: str = "arrival_ts") -> str:
    return f"{column} > now() - INTERVAL {int(minutes)} MINUTE"


def bin_seconds(minutes: int) -> int:
    """About 30 points per chart whatever the window."""
    return max(10, minutes * 60 // 30)


def _bin(minutes: int, column: str = "arrival_ts") -> str:
    return f"time_bucket(INTERVAL {bin_seconds(minutes)} SECOND, {column})"


def percentiles_over_time(minutes: int, metric: str = "ttft_s") -> str:
    """Long form: one row per (time bin, context bucket, percentile)."""
    if metric not in METRICS.values():
        raise ValueError(f"unknown metric {metric!r}")
    cols = ", ".join(f"quantile_cont({metric}, {q}) AS p{int(q * 100)}" for q in PERCENTILES)
    return (f"UNPIVOT (SELECT {_bin(minutes)} AS t, context_bucket, {cols} FROM requests "
            f"WHERE status = 'ok' AND {metric} IS NOT NULL AND {_since(minutes)} "
            "GROUP BY ALL) ON " + ", ".join(f"p{int(q * 100)}" for q in PERCENTILES)
            + " INTO NAME percentile VALUE seconds ORDER BY t, context_bucket, percentile")


def latency_by_bucket(minutes: int) -> str:
    """Percentiles of served requests per context bucket, and `met_every_slo`: the share
    of them within every SLO at once (Overview's attainment is per SLO, over all)."""
    cols = ", ".join(f"quantile_cont({m}_s, {q}) AS {m}_p{int(q * 100)}"
                     for m in ("ttft", "tpot", "e2e") for q in PERCENTILES)
    return (f"SELECT context_bucket, count(*) AS requests, {cols}, "
            "avg(CASE WHEN slo_ok THEN 1.0 ELSE 0.0 END) AS met_every_slo "
            f"FROM requests WHERE status = 'ok' AND {_since(minutes)} "
            "GROUP BY ALL ORDER BY context_bucket")


def context_distribution() -> str:
    """Share of requests per power-of-two prompt length, for each comparison period.
    Requests refused before their prompt was read (no tokens counted) have no length:
    they are left out, not counted as 1-token prompts."""
    parts = [f"SELECT '{label}' AS period, {order} AS period_order, "
             "CAST(pow(2, floor(log2(prompt_tokens))) AS BIGINT) AS tokens_from, "
             f"count(*) AS requests FROM requests WHERE prompt_tokens > 0 "
             f"AND {_since(minutes)} GROUP BY ALL"
             for order, (label, minutes) in enumerate(CONTEXT_PERIODS.items())]
    return ("SELECT period, tokens_from, requests, requests / sum(requests) OVER "
            "(PARTITION BY period) AS share FROM (" + " UNION ALL ".join(parts)
            + ") ORDER BY period_order, tokens_from")


_LENGTH_CLASS = ("CASE WHEN prompt_tokens <= length_class_low THEN 0 "
                 "WHEN prompt_tokens <= length_class_high THEN 1 ELSE 2 END")


def length_bounds_over_time(minutes: int) -> str:
    """Seed 000's length-class boundaries per time bin, as the bin's last admitted
    request was classed (long form: one row per bin and bound)."""
    return (f"UNPIVOT (SELECT {_bin(minutes)} AS t, "
            "arg_max(length_class_low, arrival_ts) AS low, "
            "arg_max(length_class_high, arrival_ts) AS high FROM requests "
            f"WHERE length_class_low IS NOT NULL AND {_since(minutes)} GROUP BY ALL) "
            "ON low, high INTO NAME bound VALUE tokens ORDER BY t, bound")


def length_classes(minutes: int) -> str:
    """Served requests per length class, each under the boundaries it was classed by:
    how many, their prompt lengths, TTFT P50 / P99 and the share within every SLO."""
    return (f"SELECT ['short', 'medium', 'long'][{_LENGTH_CLASS} + 1] AS length_class, "
            "count(*) AS requests, min(prompt_tokens) AS shortest, "
            "max(prompt_tokens) AS longest, quantile_cont(ttft_s, 0.5) AS ttft_p50, "
            "quantile_cont(ttft_s, 0.99) AS ttft_p99, "
            "avg(CASE WHEN slo_ok THEN 1.0 ELSE 0.0 END) AS met_every_slo FROM requests "
            f"WHERE status = 'ok' AND length_class_low IS NOT NULL AND {_since(minutes)} "
            f"GROUP BY {_LENGTH_CLASS}, length_class ORDER BY {_LENGTH_CLASS}")


def throughput_over_time(minutes: int) -> str:
    """Requests/s by outcome and goodput (ok and within every SLO) per time bin, every
    bin of the window present (an idle bin is 0, not a line drawn across it), each
    rate over the part of its bin inside the window (the first and last are partial).
    No rows when the window holds no request."""
    b, since = bin_seconds(minutes), f"now() - INTERVAL {int(minutes)} MINUTE"
    bucket = f"time_bucket(INTERVAL {b} SECOND, "
    covered = (f"greatest(1, epoch(least(t + INTERVAL {b} SECOND, now())) "
               f"- epoch(greatest(t, {since})))")
    return (f"WITH counts AS (SELECT {bucket}arrival_ts) AS t, count(*) AS n, "
            "count(*) FILTER (status = 'ok' AND slo_ok) AS good, "
            "count(*) FILTER (status <> 'ok') AS failed "
            f"FROM requests WHERE {_since(minutes)} GROUP BY ALL), "
            f"bins AS (SELECT unnest(generate_series({bucket}{since}), {bucket}now()), "
            f"INTERVAL {b} SECOND)) AS t) "
            f"SELECT t, coalesce(n, 0) / {covered} AS requests_per_s, "
            f"coalesce(good, 0) / {covered} AS goodput_per_s, "
            f"coalesce(failed, 0) / {covered} AS failed_per_s "
            "FROM bins LEFT JOIN counts USING (t) "
            "WHERE EXISTS (SELECT 1 FROM counts) ORDER BY t")


def outcomes(minutes: int) -> str:
    return (f"SELECT status, coalesce(error_type, '') AS error_type, count(*) AS requests "
            f"FROM requests WHERE {_since(minutes)} GROUP BY ALL ORDER BY requests DESC")


def recent_requests(limit: int = 50) -> str:
    return ("SELECT arrival_ts, request_id, status, http_status, context_bucket, prompt_tokens, "
            "output_tokens, ttft_s, tpot_s, e2e_s, error_type FROM requests "
            f"ORDER BY arrival_ts DESC LIMIT {int(limit)}")


def slowest_requests(minutes: int, limit: int = 20) -> str:
    return ("SELECT request_id, arrival_ts, status, context_bucket, prompt_tokens, "
            "output_tokens, queue_s, prefill_s, decode_s, ttft_s, e2e_s, slo_ok FROM requests "
            f"WHERE e2e_s IS NOT NULL AND {_since(minutes)} ORDER BY e2e_s DESC "
            f"LIMIT {int(limit)}")


def check_request_id(request_id: str) -> str:
    request_id = request_id.strip()
    if not _REQUEST_ID.match(request_id):
        raise ValueError("a request id is letters, digits and . _ : - (as in X-Request-Id)")
    return request_id


def waterfall(request_id: str) -> str:
    """The request's phase spans as offsets from its start (seconds)."""
    rid = check_request_id(request_id)
    names = ", ".join(f"'{n}'" for n in (SPAN_REQUEST, *PHASES))
    return ("SELECT name AS phase, epoch(start_ts) - min(epoch(start_ts)) OVER () AS start_s, "
            "epoch(end_ts) - min(epoch(start_ts)) OVER () AS end_s, duration_s FROM spans "
            f"WHERE request_id = '{rid}' AND name IN ({names}) ORDER BY start_ts, name")


def request_row(request_id: str) -> str:
    rid = check_request_id(request_id)
    return f"SELECT * FROM requests WHERE request_id = '{rid}'"


def fine_bin_seconds(minutes: int) -> int:
    """5 s bins up to a 50-minute window, then at most 600 points: a day of 5 s bins
    (17,280) passed the console's 10,000-row cap, which kept the oldest rows."""
    return max(5, minutes * 60 // 600)


def kv_actual(minutes: int) -> str:
    return (f"SELECT time_bucket(INTERVAL {fine_bin_seconds(minutes)} SECOND, ts) AS t, "
            f"avg(kv_cache_usage) AS value FROM engine_stats "
            f"WHERE {_since(minutes, 'ts')} GROUP BY ALL ORDER BY t")


def kv_forecast(minutes: int) -> str:
    """Forecasts drawn at the time they were made for (`target_ts`), per model, in the
    same bins as `kv_actual`."""
    return (f"SELECT time_bucket(INTERVAL {fine_bin_seconds(minutes)} SECOND, target_ts) "
            "AS t, avg(value) AS value, model FROM forecasts "
            f"WHERE target = 'kv_cache_usage' AND {_since(minutes, 'target_ts')} "
            "GROUP BY ALL ORDER BY t, model")


def predicted_vs_actual(minutes: int, limit: int = 2000) -> str:
    return ("SELECT arrival_ts, predictor_version, ttft_s, predicted_ttft_s, "
            "predicted_ttft_p90_s, tpot_s, predicted_tpot_s, predicted_tpot_p90_s FROM requests "
            f"WHERE status = 'ok' AND predicted_ttft_s IS NOT NULL AND ttft_s > 0 "
            f"AND {_since(minutes)} ORDER BY arrival_ts DESC LIMIT {int(limit)}")


def prediction_accuracy(minutes: int) -> str:
    """As served: each model's p50 MAPE and p90 coverage on the requests it predicted,
    by the one rule `tailguard predict eval` uses too (slo.predict.accuracy)."""
    return served_accuracy_sql(minutes)


def prediction_accuracy_by_bucket(minutes: int) -> str:
    """The same rule per context bucket: what the live `tailguard_prediction_*`
    metrics count, over the window."""
    return served_accuracy_sql(minutes, by="context_bucket")


def never_predicted(minutes: int) -> str:
    """Served requests of the window, and how many of them no model predicted."""
    return never_predicted_sql(minutes)


def last_retrain() -> str:
    """The latency predictor's last retrain decision: its `policy_events` row."""
    return ("SELECT ts, CAST(details->>'$.accepted' AS BOOLEAN) AS accepted, reason, "
            "details->>'$.trigger' AS trigger, from_state, to_state FROM policy_events "
            f"WHERE policy = '{GATE_EVENT}' ORDER BY ts DESC LIMIT 1")


EXAMPLES = {
    "Slowest requests in the last hour": slowest_requests(60),
    "P99 TTFT by context bucket (1 h)": (
        "SELECT context_bucket, count(*) AS requests, quantile_cont(ttft_s, 0.99) AS ttft_p99 "
        "FROM requests WHERE status = 'ok' AND arrival_ts > now() - INTERVAL 1 HOUR "
        "GROUP BY ALL ORDER BY context_bucket"),
    "Rejections and errors by reason (1 h)": (
        "SELECT status, http_status, error_type, count(*) AS requests FROM requests "
        "WHERE status <> 'ok' AND arrival_ts > now() - INTERVAL 1 HOUR "
        "GROUP BY ALL ORDER BY requests DESC"),
    "Policy actions applied (1 h)": (
        "SELECT action, count(*) AS requests FROM (SELECT unnest(policy_actions) AS action "
        "FROM requests WHERE arrival_ts > now() - INTERVAL 1 HOUR) "
        "GROUP BY ALL ORDER BY requests DESC"),
    "Engine load per minute (1 h)": (
        "SELECT time_bucket(INTERVAL 1 MINUTE, ts) AS minute, avg(running) AS running, "
        "avg(waiting) AS waiting, max(kv_cache_usage) AS kv_max, sum(preemptions) AS "
        "preemptions FROM engine_stats WHERE ts > now() - INTERVAL 1 HOUR "
        "GROUP BY ALL ORDER BY minute"),
    "Policy transitions (newest first)": (
        "SELECT ts, policy, from_state, to_state, reason FROM policy_events "
        "ORDER BY ts DESC LIMIT 100"),
}
