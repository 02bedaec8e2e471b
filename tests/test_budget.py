"""Budgets and burn rates from the trace log, pinned to hand-computed values; the
SQL verdicts agree with the server's Python verdicts row for row."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

from observe.record import RequestRecord
from observe.stats import EngineTimes, WallClock
from observe.tracelog import TraceLog
from slo.budget import compute_status
from slo.loading import load_spec, parse_spec
from slo.verdicts import Judge, bad_sql, event_sql, verdict

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SPEC = parse_spec("""
slos:
  - {name: ttft, sli: ttft, objective: 0.9, timeWindow: 1d,
     target: {kind: context, short_base_s: 0.2, long_base_s: 0.5, breakpoint_tokens: 1024}}
  - {name: availability, sli: availability, objective: 0.99, timeWindow: 1d}
""")


def _row(minutes_ago: float, ttft: float, ctx: int = 100, status: str = "ok",
         http_status: int = 200, priority: str = "realtime") -> dict:
    bucket = "0-1k" if ctx <= 1024 else "1k-4k"
    return {"arrival_ts": NOW - timedelta(minutes=minutes_ago), "status": status,
            "http_status": http_status, "prompt_tokens": ctx, "context_bucket": bucket,
            "priority": priority, "ttft_s": ttft if status == "ok" else None}


@pytest.fixture
def log():
    with TraceLog(":memory:") as tracelog:
        yield tracelog


def _status(log, spec=SPEC):
    log.flush()

    def query(sql):
        result = log.query(sql, max_rows=100_000)
        return result.columns, result.rows

    return compute_status(query, spec, NOW)


def _by(status, name, **group):
    return next(s for s in status.slos if s.name == name and s.group == group)


def test_burn_rates_per_window_match_hand_counts(log):
    rows = [_row(1, 0.5), _row(2, 0.1), _row(20, 0.1), _row(20, 0.1),      # 5m: 1/2 bad
            _row(50, 0.9), _row(300, 0.1), _row(300, 0.1), _row(600, 0.1),
            _row(120, 0.1, status="error", http_status=500),
            _row(2000, 0.9)]                                              # outside 1d
    for row in rows:
        log.add("requests", row)
    status = _status(log)
    ttft = {w.window: w for w in _by(status, "ttft").windows}
    assert (ttft["5m"].events, ttft["5m"].bad, ttft["5m"].burn_rate) == (2, 1, pytest.approx(5.0))
    assert (ttft["1h"].events, ttft["1h"].bad) == (5, 2)
    assert ttft["1h"].burn_rate == pytest.approx(0.4 / 0.1)
    assert (ttft["1d"].events, ttft["1d"].bad) == (8, 2)
    assert list(ttft) == ["5m", "30m", "1h", "2h", "6h", "1d"]
    overall = _by(status, "ttft")
    assert overall.attainment == pytest.approx(0.75)
    assert overall.budget_remaining == pytest.approx(1 - 0.25 / 0.1)
    avail = {w.window: w for w in _by(status, "availability").windows}
    assert (avail["1h"].bad, avail["2h"].events, avail["2h"].bad) == (0, 6, 1)


def test_long_contexts_get_their_own_budget(log):
    for row in [_row(1, 0.3, ctx=100), _row(1, 0.3, ctx=2048), _row(1, 1.1, ctx=2048)]:
        log.add("requests", row)
    status = _status(log)
    short = _by(status, "ttft", context_bucket="0-1k").windows[0]
    long = _by(status, "ttft", context_bucket="1k-4k").windows[0]
    assert (short.events, short.bad) == (1, 1)  # 300 ms > 200 ms
    assert (long.events, long.bad) == (2, 1)  # target at 2048 tokens is 1.0 s


def test_goodput_counts_requests_meeting_every_slo(log):
    for row in [_row(1, 0.1), _row(2, 0.1), _row(3, 0.5), _row(4, 0.1, priority="batch")]:
        log.add("requests", row)
    status = _status(log)
    assert status.goodput_rps["5m"] == pytest.approx(3 / 240)  # the log spans 4 minutes
    assert _by(status, "ttft", priority="batch").windows[0].events == 1


def test_an_empty_log_has_no_attainment(log):
    status = _status(log)
    assert _by(status, "ttft").attainment is None
    assert status.goodput_rps["5m"] == 0


def _random_record(rng: random.Random, i: int) -> RequestRecord:
    rec = RequestRecord(f"r{i}", arrival=1000.0 - rng.uniform(0, 3000), endpoint="chat",
                        prompt_tokens=rng.choice([0, 10, 512, 1024, 1025, 3000, 40000]),
                        output_tokens=rng.choice([1, 2, 50]))
    rec.status = rng.choice(["ok", "ok", "ok", "error", "rejected", "aborted"])
    rec.http_status = {"ok": 200, "error": 500, "rejected": rng.choice([400, 429, 503]),
                       "aborted": 499}[rec.status]
    if rec.status == "ok":
        rec.engine = EngineTimes(rec.arrival, rec.arrival + 0.01, rec.arrival + 0.1,
                                 rec.arrival + rng.uniform(0.1, 3))
        rec.first_token = rec.arrival + rng.uniform(0.05, 3.0)
        rec.end = rec.engine.last_token + 0.01
    return rec


def test_sql_verdicts_agree_with_the_servers_row_for_row(log):
    rng = random.Random(7)
    records = [_random_record(rng, i) for i in range(400)]
    spec = load_spec()
    judge = Judge(spec)
    for rec in records:
        judge.judge(rec)
        log.add("requests", rec.row(WallClock(offset=0.0)))
    log.flush()
    for slo in spec.slos:
        sql = (f"SELECT request_id FROM requests WHERE {event_sql(slo)}",
               f"SELECT request_id FROM requests WHERE {bad_sql(slo)}")
        events = {r[0] for r in log.query(sql[0]).rows}
        bad = {r[0] for r in log.query(sql[1]).rows}
        assert events == {r.request_id for r in records if verdict(slo, r) is not None}, slo.name
        assert bad == {r.request_id for r in records if verdict(slo, r) is False}, slo.name
