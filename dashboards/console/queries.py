"""The SQL behind the console's panels, one function per question."""

from __future__ import annotations

WINDOWS = {"5 min": 5, "15 min": 15, "1 hour": 60, "6 hours": 360, "1 day": 1440}


def _since(minutes: int) -> str:
    return f"arrival_ts > now() - INTERVAL {int(minutes)} MINUTE"


def _bin_seconds(minutes: int) -> int:
    """About 30 points per chart whatever the window."""
    return max(10, minutes * 60 // 30)


def latency_over_time(minutes: int) -> str:
    return (f"SELECT time_bucket(INTERVAL {_bin_seconds(minutes)} SECOND, arrival_ts) AS t, "
            "context_bucket, quantile_cont(ttft_s, 0.5) AS ttft_p50, "
            "quantile_cont(ttft_s, 0.99) AS ttft_p99, quantile_cont(e2e_s, 0.99) AS e2e_p99, "
            f"count(*) AS requests FROM requests WHERE status = 'ok' AND {_since(minutes)} "
            "GROUP BY ALL ORDER BY t, context_bucket")


def latency_by_bucket(minutes: int) -> str:
    cols = ", ".join(f"quantile_cont({m}_s, {q}) AS {m}_p{int(q * 100)}"
                     for m in ("ttft", "tpot", "e2e") for q in (0.5, 0.95, 0.99))
    return (f"SELECT context_bucket, count(*) AS requests, {cols}, "
            "avg(CASE WHEN slo_ok THEN 1.0 ELSE 0.0 END) AS slo_attainment "
            f"FROM requests WHERE status = 'ok' AND {_since(minutes)} "
            "GROUP BY ALL ORDER BY context_bucket")


def outcomes(minutes: int) -> str:
    return (f"SELECT status, coalesce(error_type, '') AS error_type, count(*) AS requests "
            f"FROM requests WHERE {_since(minutes)} GROUP BY ALL ORDER BY requests DESC")


def recent_requests(limit: int = 50) -> str:
    return ("SELECT arrival_ts, request_id, status, http_status, context_bucket, prompt_tokens, "
            "output_tokens, ttft_s, tpot_s, e2e_s, error_type FROM requests "
            f"ORDER BY arrival_ts DESC LIMIT {int(limit)}")
