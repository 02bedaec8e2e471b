"""The console's pure parts without a server: the red/amber/green rules
(dashboards/console/health.py) and every SQL it sends (dashboards/console/queries.py),
run on a real DuckDB trace file."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from dashboards.console import health as H
from dashboards.console import queries as Q
from observe.query import query_file
from observe.schema import create_schema
from slo.predict.accuracy import GATE_EVENT

# --- health ----------------------------------------------------------------------------

# For a 30-day period: page 1h/5m at 14.4x, page 6h/30m at 6x, ticket 1d/2h at 3x,
# ticket 3d/6h at 1x (slo.windows.BURN_WINDOWS).
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d")


def slo(burn: dict | None = None, events: int = 100, budget: float | None = 0.9,
        period: str = "30d") -> dict:
    burn = burn or {}
    return {"name": "ttft", "sli": "ttft", "objective": 0.99, "period": period, "group": {},
            "attainment": None if budget is None else 0.99 + 0.01 * budget,
            "budget_remaining": budget,
            "windows": [{"window": w, "events": events, "bad": 0, "error_ratio": 0.0,
                         "burn_rate": burn.get(w, 0.0 if events else None)} for w in WINDOWS]}


HEALTH_CASES = [
    # id, slo status, alerts firing, health
    ("quiet", slo(), [], H.GREEN),
    ("no events", slo(events=0, budget=None), [], H.GREY),
    ("no events but burn values", slo({"1h": 20, "5m": 20}, events=0), [
        "page 1h/5m > 14.4x"], H.GREY),
    ("page fast", slo({"1h": 15, "5m": 20}), ["page 1h/5m > 14.4x"], H.RED),
    ("page at exactly the factor", slo({"1h": 14.4, "5m": 14.4}), ["page 1h/5m > 14.4x"],
     H.RED),
    ("page slow", slo({"6h": 7, "30m": 6}), ["page 6h/30m > 6x"], H.RED),
    ("long window only: no alert", slo({"1h": 50, "5m": 1}), [], H.GREEN),
    ("short window only: no alert", slo({"1h": 1, "5m": 50}), [], H.GREEN),
    ("just under the page factor", slo({"1h": 14.3, "5m": 20}), [], H.GREEN),
    ("ticket 1d/2h", slo({"1d": 3, "2h": 4}), ["ticket 1d/2h > 3x"], H.AMBER),
    ("ticket 3d/6h", slo({"3d": 1.5, "6h": 1.2}), ["ticket 3d/6h > 1x"], H.AMBER),
    ("page and ticket", slo({"1h": 20, "5m": 20, "6h": 7, "30m": 7, "1d": 5, "2h": 5,
                              "3d": 2}), [
        "page 1h/5m > 14.4x", "page 6h/30m > 6x", "ticket 1d/2h > 3x", "ticket 3d/6h > 1x"],
     H.RED),
    ("budget spent", slo(budget=0.0), [], H.RED),
    ("budget overspent", slo(budget=-0.4), [], H.RED),
    ("low budget", slo(budget=0.49), [], H.AMBER),
    ("half the budget is fine", slo(budget=0.5), [], H.GREEN),
    ("no budget figure", slo(budget=None), [], H.GREEN),
    ("missing burn windows", {**slo(), "windows": [
        {"window": "30d", "events": 10, "burn_rate": 0.1}]}, [], H.GREEN),
    ("burn rate None", slo({"1h": None, "5m": 99}), [], H.GREEN),
]


@pytest.mark.parametrize("status, alerts, expected", [c[1:] for c in HEALTH_CASES],
                         ids=[c[0] for c in HEALTH_CASES])
def test_health_and_firing(status, alerts, expected):
    assert H.firing(status) == alerts
    assert H.health(status) == expected


def test_health_counts_events_in_the_period_window_only():
    status = slo(events=0, budget=None)
    status["windows"][0]["events"] = 5  # 5m has events, 30d does not
    assert H.health(status) == H.GREY
    status["windows"][-1]["events"] = 5
    assert H.health(status) == H.GREEN


def test_factors_follow_the_period():
    # A 7-day period: page 1h/5m at 0.02 * 168 = 3.36x.
    status = slo({"1h": 3.4, "5m": 3.4}, period="7d")
    status["windows"].append({"window": "7d", "events": 10, "burn_rate": 0.1})
    assert H.firing(status)[0] == "page 1h/5m > 3.36x"
    assert H.health(status) == H.RED


@pytest.mark.parametrize("states, expected", [
    ([], H.GREY),
    ([H.GREY], H.GREY),
    ([H.GREEN, H.GREY], H.GREEN),
    ([H.GREY, H.AMBER, H.GREEN], H.AMBER),
    ([H.GREEN, H.AMBER, H.RED, H.GREY], H.RED),
    ([H.RED, H.RED], H.RED),
])
def test_worst(states, expected):
    assert H.worst(states) == expected


def test_every_state_has_a_streamlit_colour():
    assert set(H.COLORS) == {H.GREEN, H.AMBER, H.RED, H.GREY}
    assert set(H.COLORS.values()) <= {"green", "orange", "red", "gray", "blue", "violet",
                                      "rainbow", "primary"}


# --- queries ---------------------------------------------------------------------------

UTC = timezone.utc


@pytest.fixture(scope="module")
def trace_db(tmp_path_factory) -> str:
    """A trace file with a few rows of each table, all recent."""
    path = str(tmp_path_factory.mktemp("console") / "trace.duckdb")
    now = datetime.now(UTC)
    with duckdb.connect(path) as conn:
        create_schema(conn)
        for i, (bucket, prompt, status, actions) in enumerate([
                ("0-1k", 12, "ok", []), ("0-1k", 700, "ok", ["cap_max_tokens"]),
                ("1k-4k", 2000, "ok", []), ("0-1k", 30, "error", ["shed"])]):
            ok = status == "ok"
            conn.execute(
                "INSERT INTO requests (request_id, arrival_ts, status, http_status, error_type,"
                " context_bucket, prompt_tokens, output_tokens, queue_s, prefill_s, decode_s,"
                " ttft_s, tpot_s, e2e_s, slo_ok, policy_actions, predicted_ttft_s,"
                " predicted_ttft_p90_s, predicted_tpot_s, predicted_tpot_p90_s,"
                " predictor_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?, ?, ?)",
                [f"req-{i}", now - timedelta(seconds=30 * i + 5), status, 200 if ok else 503,
                 None if ok else "overloaded", bucket, prompt, 4 if ok else 0, 0.01, 0.02,
                 0.03, 0.05 * (i + 1) if ok else None, 0.01 if ok else None,
                 0.1 * (i + 1) if ok else None, ok, actions, 0.06, 0.2, 0.01, 0.02,
                 "hgb-test"])
            if ok:
                start = now - timedelta(seconds=30 * i + 5)
                for j, name in enumerate(("llm.request", *Q.PHASES)):
                    conn.execute(
                        "INSERT INTO spans (request_id, span_id, name, start_ts, end_ts,"
                        " duration_s) VALUES (?, ?, ?, ?, ?, ?)",
                        [f"req-{i}", f"s{i}-{j}", name, start + timedelta(milliseconds=10 * j),
                         start + timedelta(milliseconds=10 * j + 5), 0.005])
        for k in range(3):
            conn.execute("INSERT INTO engine_stats (ts, running, waiting, kv_cache_usage,"
                         " preemptions) VALUES (?, ?, ?, ?, ?)",
                         [now - timedelta(seconds=10 * k), k, 1, 0.1 * k, 0])
            conn.execute("INSERT INTO forecasts (ts, target_ts, target, horizon_s, model, value)"
                         " VALUES (?, ?, 'kv_cache_usage', 300, 'last_value', ?)",
                         [now - timedelta(seconds=10 * k),
                          now - timedelta(seconds=10 * k - 300), 0.2])
        conn.execute("INSERT INTO policy_events (ts, policy, from_state, to_state, reason) "
                     "VALUES (?, 'token_cap', 'inactive', 'active', 'queue depth 7 > 5')",
                     [now])
    return path


def run(path: str, sql: str) -> tuple[list[str], list[tuple]]:
    result = query_file(path, sql, max_rows=10_000)  # read-only, as TraceFile runs it
    return result.columns, result.rows


def rows_as_dicts(path: str, sql: str) -> list[dict]:
    columns, rows = run(path, sql)
    return [dict(zip(columns, row)) for row in rows]


@pytest.mark.parametrize("label, metric", list(Q.METRICS.items()))
def test_percentiles_over_time(trace_db, label, metric):
    rows = rows_as_dicts(trace_db, Q.percentiles_over_time(15, metric))
    assert list(rows[0]) == ["t", "context_bucket", "percentile", "seconds"]
    assert {r["percentile"] for r in rows} == {"p50", "p95", "p99"}
    assert {r["context_bucket"] for r in rows} == {"0-1k", "1k-4k"}
    assert all(r["seconds"] is not None and r["seconds"] > 0 for r in rows)


def test_percentiles_over_time_refuses_an_unknown_metric():
    with pytest.raises(ValueError, match="unknown metric"):
        Q.percentiles_over_time(15, "prompt_tokens; DROP TABLE requests")


def test_latency_by_bucket(trace_db):
    rows = rows_as_dicts(trace_db, Q.latency_by_bucket(15))
    assert list(rows[0]) == ["context_bucket", "requests"] + [
        f"{m}_p{p}" for m in ("ttft", "tpot", "e2e") for p in (50, 95, 99)] + ["met_every_slo"]
    assert [(r["context_bucket"], r["requests"]) for r in rows] == [("0-1k", 2), ("1k-4k", 1)]
    assert rows[0]["ttft_p50"] == pytest.approx(0.075)  # ok 0-1k requests: 0.05, 0.1
    assert rows[0]["met_every_slo"] == 1.0


def test_context_distribution(trace_db):
    rows = rows_as_dicts(trace_db, Q.context_distribution())
    assert list(rows[0]) == ["period", "tokens_from", "requests", "share"]
    assert [r["period"] for r in rows][:1] == ["last 5 min"]
    five = {r["tokens_from"]: r["requests"] for r in rows if r["period"] == "last 5 min"}
    assert five == {8: 1, 512: 1, 1024: 1, 16: 1}  # 12, 700, 2000, 30 tokens
    for period in Q.CONTEXT_PERIODS:
        assert sum(r["share"] for r in rows if r["period"] == period) == pytest.approx(1.0)


def test_throughput_over_time(trace_db):
    rows = rows_as_dicts(trace_db, Q.throughput_over_time(15))
    assert list(rows[0]) == ["t", "requests_per_s", "goodput_per_s", "failed_per_s"]
    bin_s, now = Q.bin_seconds(15), datetime.now(UTC)
    start = now - timedelta(minutes=15)

    def covered(t) -> float:  # the part of a bin inside the window, as the query has it
        return max(1.0, (min(t + timedelta(seconds=bin_s), now) - max(t, start))
                   .total_seconds())

    # every bin of the window is there, idle ones at zero (no ramp drawn across them)
    assert len(rows) in (15 * 60 // bin_s, 15 * 60 // bin_s + 1)
    assert sum(r["requests_per_s"] == 0 for r in rows) >= len(rows) - 4
    for column, count in (("requests_per_s", 4), ("goodput_per_s", 3), ("failed_per_s", 1)):
        assert sum(r[column] * covered(r["t"]) for r in rows) == pytest.approx(count, rel=0.05)


def test_throughput_of_an_empty_window_has_no_rows(tmp_path):
    path = str(tmp_path / "empty.duckdb")
    with duckdb.connect(path) as conn:
        create_schema(conn)
    assert run(path, Q.throughput_over_time(15))[1] == []


def test_bin_seconds():
    assert [Q.bin_seconds(m) for m in Q.WINDOWS.values()] == [10, 30, 120, 720, 2880]


def test_outcomes(trace_db):
    assert run(trace_db, Q.outcomes(15)) == (
        ["status", "error_type", "requests"], [("ok", "", 3), ("error", "overloaded", 1)])


def test_recent_and_slowest_requests(trace_db):
    columns, rows = run(trace_db, Q.recent_requests(2))
    assert columns[:2] == ["arrival_ts", "request_id"]
    assert [r[1] for r in rows] == ["req-0", "req-1"]
    columns, rows = run(trace_db, Q.slowest_requests(15))
    assert columns == ["request_id", "arrival_ts", "status", "context_bucket", "prompt_tokens",
                       "output_tokens", "queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s",
                       "slo_ok"]
    assert [r[0] for r in rows] == ["req-2", "req-1", "req-0"]


def test_waterfall_and_request_row(trace_db):
    rows = rows_as_dicts(trace_db, Q.waterfall("req-1"))
    assert [r["phase"] for r in rows] == ["llm.request", *Q.PHASES]
    assert [round(r["start_s"], 3) for r in rows] == [0.0, 0.01, 0.02, 0.03, 0.04]
    assert [round(r["end_s"], 3) for r in rows] == [0.005, 0.015, 0.025, 0.035, 0.045]
    columns, rows = run(trace_db, Q.request_row("req-1"))
    assert len(rows) == 1 and rows[0][columns.index("request_id")] == "req-1"
    assert run(trace_db, Q.waterfall("no-such-request"))[1] == []


def test_kv_actual_and_forecast(trace_db):
    columns, rows = run(trace_db, Q.kv_actual(15))
    assert columns == ["t", "value"] and len(rows) >= 1
    assert max(v for _, v in rows) <= 0.2 + 1e-9
    columns, rows = run(trace_db, Q.kv_forecast(15))
    assert columns == ["t", "value", "model"]
    # forecasts are drawn at their target time, 5 minutes ahead: all within 15 min
    assert [(v, m) for _, v, m in rows] == [(0.2, "last_value")] * 3


def test_predicted_vs_actual_and_accuracy(trace_db):
    columns, rows = run(trace_db, Q.predicted_vs_actual(15))
    assert columns == ["arrival_ts", "predictor_version", "ttft_s", "predicted_ttft_s",
                       "predicted_ttft_p90_s", "tpot_s", "predicted_tpot_s",
                       "predicted_tpot_p90_s"]
    assert len(rows) == 3
    rows = rows_as_dicts(trace_db, Q.prediction_accuracy(15))
    assert list(rows[0]) == ["predictor_version", "requests", "ttft_p50_mape",
                             "ttft_p90_coverage", "tpot_p50_mape", "tpot_p90_coverage"]
    assert rows[0]["predictor_version"] == "hgb-test" and rows[0]["requests"] == 3
    assert rows[0]["ttft_p90_coverage"] == 1.0  # 0.05, 0.1, 0.15 all <= 0.2
    assert rows[0]["ttft_p50_mape"] == pytest.approx((0.2 + 0.4 + 0.6) / 3)  # |0.06 - t| / t
    assert rows[0]["tpot_p90_coverage"] == 1.0
    by_bucket = rows_as_dicts(trace_db, Q.prediction_accuracy_by_bucket(15))
    assert [(r["context_bucket"], r["requests"]) for r in by_bucket] == [("0-1k", 2),
                                                                        ("1k-4k", 1)]
    assert by_bucket[0]["ttft_p50_mape"] == pytest.approx((0.2 + 0.4) / 2)
    assert by_bucket[1]["ttft_p50_mape"] == pytest.approx(0.6)


def test_last_retrain_is_the_newest_gate_decision(tmp_path):
    path = str(tmp_path / "trace.duckdb")
    now = datetime.now(UTC)
    with duckdb.connect(path) as conn:
        create_schema(conn)
        conn.execute("INSERT INTO policy_events VALUES (?, 'token_cap', 'inactive', 'active', "
                     "'queue depth 7 > 5', NULL)", [now])
        for age, was, then, reason, details in (
                (60, "seed-003", "hgb-1", "accepted: ...", '{"accepted": true}'),
                (30, "hgb-1", "hgb-1", "refused: ...",
                 '{"accepted": false, "trigger": "admin"}')):
            conn.execute("INSERT INTO policy_events VALUES (?, ?, ?, ?, ?, ?)",
                         [now - timedelta(seconds=age), GATE_EVENT, was, then, reason, details])
    (row,) = rows_as_dicts(path, Q.last_retrain())
    assert row == {"ts": now - timedelta(seconds=30), "accepted": False,
                   "reason": "refused: ...", "trigger": "admin", "from_state": "hgb-1",
                   "to_state": "hgb-1"}


EXAMPLE_COLUMNS = {
    "Slowest requests in the last hour": ["request_id", "arrival_ts", "status",
                                          "context_bucket", "prompt_tokens", "output_tokens",
                                          "queue_s", "prefill_s", "decode_s", "ttft_s",
                                          "e2e_s", "slo_ok"],
    "P99 TTFT by context bucket (1 h)": ["context_bucket", "requests", "ttft_p99"],
    "Rejections and errors by reason (1 h)": ["status", "http_status", "error_type",
                                              "requests"],
    "Policy actions applied (1 h)": ["action", "requests"],
    "Engine load per minute (1 h)": ["minute", "running", "waiting", "kv_max", "preemptions"],
    "Policy transitions (newest first)": ["ts", "policy", "from_state", "to_state", "reason"],
}


def test_every_example_is_covered():
    assert set(Q.EXAMPLES) == set(EXAMPLE_COLUMNS)


@pytest.mark.parametrize("label", list(EXAMPLE_COLUMNS))
def test_examples_run_read_only(trace_db, label):
    columns, rows = run(trace_db, Q.EXAMPLES[label])
    assert columns == EXAMPLE_COLUMNS[label]
    assert rows, label  # every example finds the rows the fixture wrote


def test_example_values(trace_db):
    assert run(trace_db, Q.EXAMPLES["Rejections and errors by reason (1 h)"])[1] == [
        ("error", 503, "overloaded", 1)]
    assert sorted(run(trace_db, Q.EXAMPLES["Policy actions applied (1 h)"])[1]) == [
        ("cap_max_tokens", 1), ("shed", 1)]
    assert run(trace_db, Q.EXAMPLES["Policy transitions (newest first)"])[1][0][1:] == (
        "token_cap", "inactive", "active", "queue depth 7 > 5")


@pytest.mark.parametrize("good", ["req-1", "chatcmpl-abc123", "a.b_c:d-e", " padded ",
                                  "x" * 128])
def test_check_request_id_accepts(good):
    assert Q.check_request_id(good) == good.strip()


@pytest.mark.parametrize("bad", [
    "", "   ", "x" * 129, "req'1", "req-1' OR '1'='1", "'; DROP TABLE requests; --",
    'req"1', "req 1", "req;1", "req\\1", "req\n1", "réq", "req/1", "req%1", "(req)",
])
def test_check_request_id_rejects(bad):
    with pytest.raises(ValueError, match="a request id is"):
        Q.check_request_id(bad)
    with pytest.raises(ValueError):
        Q.waterfall(bad)
    with pytest.raises(ValueError):
        Q.request_row(bad)


@pytest.mark.parametrize("limiter, text", [
    ({"prefill_gate_tokens": None, "retry_bookings": 0}, ""),
    ({"prefill_gate_tokens": 2048, "engine_prefill_tokens": 1501, "retry_bookings": 0},
     "; prefill gate 1501/2048 tokens"),
    ({"prefill_gate_tokens": 2048, "engine_prefill_tokens": 0, "retry_bookings": 3},
     "; prefill gate 0/2048 tokens; 3 refused requests booked to retry"),
    ({"prefill_gate_tokens": 2048, "engine_prefill_tokens": 0, "retry_bookings": 0,
      "vip_kv_reserve_tokens": 1024, "kv_free_tokens": 27000},
     "; prefill gate 0/2048 tokens; KV cache 27000 tokens free, 1024 kept for VIPs"),
    ({"prefill_gate_tokens": 2048, "engine_prefill_tokens": 0, "retry_bookings": 2,
      "promise_holds": 7},
     "; prefill gate 0/2048 tokens; 7 requests kept in front for an earlier one's "
     "deadline; 2 refused requests booked to retry"),
    ({}, ""),  # an older server's answer
])
def test_the_policies_page_states_the_gate_and_the_bookings(limiter, text):
    from dashboards.console.views.policies import _gate

    assert _gate(limiter) == text


def test_a_cut_answer_says_so_on_the_frame_from_a_file_and_from_a_server(tmp_path):
    """The console's frames carry the query's truncation (the SQL box warns on it): a
    trace file's answer as `TraceFile.query` reads it, a server's JSON as `_frame` does."""
    from dashboards.console.client import TraceFile, _frame

    path = str(tmp_path / "t.duckdb")
    duckdb.connect(path).close()
    cut = TraceFile(path).query("SELECT i FROM range(10005) t(i)")
    whole = TraceFile(path).query("SELECT i FROM range(10) t(i)")
    assert (len(cut), cut.attrs["truncated_by"]) == (10_000, "max_rows")
    assert (len(whole), whole.attrs["truncated_by"]) == (10, None)
    by_size = _frame({"columns": ["x"], "rows": [[1]], "truncated": True,
                      "truncated_by": "max_bytes"})
    assert by_size.attrs["truncated_by"] == "max_bytes"


LIMITER = {"in_flight": 2, "limit": 16, "waiting": 0, "prefill_gate_tokens": None}


@pytest.mark.parametrize("signals, text", [
    ({"p99_s": 0.2346, "load": 0.5, "kv_usage": 0.25, "kv_forecast": 0.3, "queue_depth": 3},
     "Signals: P99 0.235 s, load 50%, KV 25% (forecast 30%), queue 3"),
    ({"p99_s": None, "load": 0.0, "kv_usage": 0.0, "kv_forecast": None, "queue_depth": 0},
     "Signals: P99 -, load 0%, KV 0% (forecast -), queue 0"),  # null is not zero
    ({}, "Signals: P99 -, load -, KV - (forecast -), queue 0"),
])
def test_the_policies_page_shows_null_signals_as_missing_not_as_zero(signals, text):
    from dashboards.console.views.policies import signals_caption

    assert signals_caption(signals, LIMITER) == text + "; limiter 2/16 in flight, 0 waiting."


def test_the_context_mix_leaves_out_requests_refused_before_their_prompt_was_read(tmp_path):
    path = str(tmp_path / "mix.duckdb")
    now = datetime.now(UTC)
    with duckdb.connect(path) as conn:
        create_schema(conn)
        for i, (status, prompt) in enumerate([("ok", 300), ("rejected", 0),
                                              ("rejected", None), ("rejected", 21)]):
            conn.execute("INSERT INTO requests (request_id, arrival_ts, status, prompt_tokens)"
                         " VALUES (?, ?, ?, ?)", [f"r{i}", now - timedelta(seconds=5), status,
                                                  prompt])
    five = {r["tokens_from"]: r["requests"] for r in rows_as_dicts(path, Q.context_distribution())
            if r["period"] == "last 5 min"}
    assert five == {256: 1, 16: 1}  # a refused prompt of known length still counts


@pytest.mark.parametrize("entry, label", [
    ({"policy": "batch_control", "effective": "active", "limit": 16, "initial": 16,
      "cap": 64}, "⚙️ limit 16 (cap 64)"),  # idle: a controller at rest, no alarm colour
    ({"policy": "batch_control", "effective": "active", "limit": 24, "initial": 16,
      "cap": 64}, "⚙️ limit 24 (cap 64)"),  # raised: more room, no trouble
    ({"policy": "batch_control", "effective": "active", "limit": 8, "initial": 16,
      "cap": 64}, "🟠 limit 8 (cut from 16)"),
    ({"policy": "batch_control", "effective": "inactive", "limit": 64},
     "⚪ forced off (limit 64)"),
    ({"policy": "batch_control", "effective": "active", "limit": 16}, "⚙️ limit 16"),
    ({"policy": "token_cap", "effective": "active"}, "🔴 active"),
    ({"policy": "token_cap", "effective": "inactive"}, "🟢 inactive"),
])
def test_batch_control_shows_its_limit_and_is_coloured_only_when_it_lowered_it(entry, label):
    from dashboards.console.views.policies import effective_label

    assert effective_label(entry) == label


def test_a_day_of_kv_samples_reaches_the_chart_up_to_now(tmp_path):
    """A day of one-per-5-s engine_stats rows: the 1-day chart holds the newest hours
    too (5 s bins made 17,280 rows, and the 10,000-row cap kept the oldest)."""
    path = str(tmp_path / "day.duckdb")
    with duckdb.connect(path) as conn:
        create_schema(conn)
        conn.execute("INSERT INTO engine_stats (ts, running, waiting, kv_cache_usage, "
                     "preemptions) SELECT now() - to_seconds(5 * i), 1, 0, 0.5, 0 "
                     "FROM range(17280) t(i)")
        conn.execute("INSERT INTO forecasts (ts, target_ts, target, horizon_s, model, value) "
                     "SELECT now() - to_seconds(5 * i), now() - to_seconds(5 * i) + "
                     "INTERVAL 300 SECOND, 'kv_cache_usage', 300, m, 0.4 "
                     "FROM range(17280) t(i), (VALUES ('lstm'), ('last_value')) v(m)")
    day = 24 * 60
    for sql in (Q.kv_actual(day), Q.kv_forecast(day)):
        result = query_file(path, sql, max_rows=10_000)
        assert not result.truncated and len(result.rows) <= 1_300
        newest = max(row[0] for row in result.rows)
        assert datetime.now(UTC) - newest < timedelta(minutes=5), newest


def test_every_time_axis_is_utc_on_a_24_hour_clock():
    """Charts keep the tables' convention: Vega-Lite draws a time axis in the browser's
    zone unless told (a chart said 06:28 where the table said 18:28)."""
    import pandas as pd

    from dashboards.console import charts

    t = pd.to_datetime(["2026-12-04T18:28:00Z"])
    drawn = [
        charts.percentiles(pd.DataFrame({"t": t, "seconds": [0.1], "context_bucket": ["0-1k"],
                                         "percentile": ["p99"]}), "TTFT"),
        charts.throughput(pd.DataFrame({"t": t, "requests_per_s": [1.0],
                                        "goodput_per_s": [1.0], "failed_per_s": [0.0]})),
        charts.forecast(pd.DataFrame({"t": t, "value": [0.5]}),
                        pd.DataFrame({"t": t, "value": [0.6], "model": ["lstm"]}), 0.9),
    ]
    for chart in drawn:
        spec = chart.to_dict()
        encoding = (spec.get("layer") or [spec])[0]["encoding"]
        assert encoding["x"]["scale"] == {"type": "utc"}
        assert encoding["x"]["axis"]["format"] == "%H:%M"
        assert encoding["tooltip"][0]["formatType"] == "utc"
