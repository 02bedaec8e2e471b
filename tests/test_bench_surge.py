"""The policy-surge benchmark's scoring (bench/policy/surge_scoring.py): smooth goodput, the
realtime lane's attainment with demotion as a miss, the on/off comparison and the
alternating order. Every figure here can come out against the policies."""

from __future__ import annotations

import math

import pytest

from bench.policy.surge import side_order
from bench.policy.surge_scoring import (
    Outcome,
    compare,
    credit,
    goodput,
    goodput_per_served,
    admitted_attainment,
    lane_attainment,
    miss_prediction,
    retries,
    outcome,
    prediction_accuracy,
    smooth_goodput,
    summarize,
)
from loadgen.runner import Result
from slo.targets import DEFAULT_TTFT_TARGET

ASK = 64  # max_tokens the surge workload asks
PROMPT = 100
TARGET_S = DEFAULT_TTFT_TARGET(PROMPT)


def on_time(got: int = ASK, kept: int = PROMPT) -> Outcome:
    return Outcome(True, True, ASK, got, PROMPT, kept)


LATE = Outcome(True, False, ASK, ASK, PROMPT, PROMPT)
SHED = Outcome(False, False, ASK, 0, PROMPT, PROMPT)


@pytest.mark.parametrize(("o", "want"), [
    (on_time(), 1.0),
    (SHED, 0.0),
    (LATE, 0.0),
    (on_time(got=16), 0.25),  # max_tokens capped 64 -> 16
    (on_time(kept=50), 0.5),  # prompt truncated to half
    (on_time(got=32, kept=50), 0.25),  # both: the shares multiply
    (Outcome(True, False, ASK, 16, PROMPT, PROMPT), 0.0),  # capped and still late
    (Outcome(True, True, 0, 0, 0, 0), 1.0),  # nothing asked, nothing lost
    (on_time(got=ASK + 5), 1.0),  # more than asked earns no more than 1
], ids=["served untouched on time earns 1", "a shed request earns 0",
        "a late request earns 0", "capped to a quarter earns a quarter",
        "truncated to half earns half", "capped and truncated multiply",
        "capped and late earns 0", "an empty ask earns 1", "credit is capped at 1"])
def test_credit_is_the_share_of_the_ask_kept_on_time(o, want):
    assert credit(o) == want


def test_shedding_everything_but_the_easy_wins_per_served_but_loses_smooth_goodput():
    off = [on_time()] * 60 + [LATE] * 40  # no policy: 100 served, 60 on time
    on = [on_time()] * 10 + [SHED] * 90  # shed all but 10 sure ones
    assert (goodput_per_served(off), goodput_per_served(on)) == (0.6, 1.0)  # gamed
    assert (smooth_goodput(off, 10.0), smooth_goodput(on, 10.0)) == (6.0, 1.0)
    rows = [{"round": 0, "side": "off", "smooth_goodput_rps": 6.0},
            {"round": 0, "side": "on", "smooth_goodput_rps": 1.0}]
    assert compare(rows, "smooth_goodput_rps")["met"] is False


def test_capping_every_request_wins_plain_goodput_but_not_smooth_goodput():
    off = [on_time()] * 50 + [LATE] * 50
    on = [on_time(got=4)] * 100  # one token in 16 of what was asked, all on time
    assert (goodput(off, 10.0), goodput(on, 10.0)) == (5.0, 10.0)
    assert (smooth_goodput(off, 10.0), smooth_goodput(on, 10.0)) == (5.0, 0.625)


def test_no_served_request_has_no_per_served_share():
    assert goodput_per_served([SHED, SHED]) is None


def row(priority="realtime", status="ok", ttft_s=0.1, target=1.0, actions=()):
    return {"priority": priority, "status": status, "ttft_s": ttft_s,
            "slo_ttft_target_s": target, "policy_actions": list(actions)}


@pytest.mark.parametrize(("rows", "want"), [
    ([row(), row()], (2, 1.0)),
    ([row(), row(ttft_s=2.0)], (2, 0.5)),
    # served on time by the batch lane after a demotion: still a miss of the lane
    ([row(), row(priority="batch", actions=["demote:predicted_miss"])], (2, 0.5)),
    ([row(priority="batch", actions=["demote:deadline"])], (1, 0.0)),
    # shed at the HTTP check: never entered the lane
    ([row(), row(status="rejected", ttft_s=None, actions=["shed:breaker_l1"])], (1, 1.0)),
    # timed out waiting in the lane: a miss
    ([row(), row(status="rejected", ttft_s=None)], (2, 0.5)),
    ([row(priority="batch")], (0, None)),
    ([row(actions=["cap_max_tokens:16"])], (1, 1.0)),
], ids=["all on time", "one late", "demoted then served on time is a miss",
        "only a demoted request", "shed before admission is not in the lane",
        "refused in the lane is a miss", "no realtime request", "a cap is no demotion"])
def test_the_realtime_lane_counts_a_demoted_request_as_a_miss(rows, want):
    assert lane_attainment(rows) == want


def test_the_side_that_runs_first_alternates():
    firsts = [side_order(rnd)[0][0] for rnd in range(5)]
    assert firsts == ["off", "on", "off", "on", "off"]
    assert all({s for s, _ in side_order(rnd)} == {"on", "off"} for rnd in range(5))


def rounds(pairs):
    return [{"round": i, "side": side, "g": value} for i, (off, on) in enumerate(pairs)
            for side, value in (("off", off), ("on", on))]


@pytest.mark.parametrize(("pairs", "median", "spread", "wins", "met"), [
    ([(2, 4), (2, 3), (2, 3), (2, 5), (2, 3)], 1.5, (1.5, 2.5), 5, True),
    ([(2, 4), (2, 3), (2, 3), (2, 5), (2, 1)], 1.5, (0.5, 2.5), 4, False),
    ([(2, 1), (2, 1), (2, 1), (2, 1), (2, 1)], 0.5, (0.5, 0.5), 0, False),
    ([(0, 4), (2, 4), (2, 3)], 2.0, (1.5, float("inf")), 3, True),
    ([(0, 0), (2, 4), (2, 3)], 1.5, (1.0, 2.0), 2, False),
], ids=["every round at the goal", "one bad round fails the median's good verdict",
        "policies worse every round", "off at zero and on above is infinitely ahead",
        "both at zero is a tie"])
def test_the_verdict_is_every_round_against_the_goal(pairs, median, spread, wins, met):
    got = compare(rounds(pairs), "g")
    assert (got["median"], (got["min"], got["max"]), got["on_wins"], got["met"]) == (
        median, spread, wins, met)


def test_no_complete_round_is_not_met():
    assert compare([{"round": 0, "side": "off", "g": 1.0}], "g")["met"] is False


def served(max_tokens=ASK, output=ASK, ttft_s=TARGET_S / 2) -> Result:
    return Result(0, 0.0, PROMPT, max_tokens, prompt_tokens=PROMPT, output_tokens=output,
                  ttft_s=ttft_s, e2e_s=1.0, http_status=200)


def shed() -> Result:
    r = Result(0, 0.0, PROMPT, ASK)
    r.fail("shed", 503)
    return r


def test_a_client_result_is_scored_by_what_it_asked_and_got():
    assert credit(outcome(served(output=16))) == 0.25
    assert credit(outcome(served(ttft_s=TARGET_S * 2))) == 0.0
    assert credit(outcome(shed())) == 0.0


def test_one_run_summary_from_client_results():
    quota = Result(0, 0.0, PROMPT, ASK)
    quota.fail("client_sequence_limit", 429)
    by_key = {"realtime": [served(), shed()], "vip": [served(output=32)],
              "batch": [served(ttft_s=TARGET_S * 2), quota]}
    assert summarize(by_key, 2.0) == {
        "offered": 5, "ok": 3, "shed": 1, "not_served": {"shed": 1, "client_sequence_limit": 1},
        "goodput_rps": 1.0, "smooth_goodput_rps": 0.75, "goodput_per_served": 2 / 3,
        "realtime_key_attainment": 2 / 3, "retried": 0, "retry_on_time": None,
        "deferred_retried": 0}


def row(priority="realtime", vip=False, status="ok", ttft_s=0.1, target=0.2, actions=(),
        estimate=None) -> dict:
    return {"priority": priority, "vip": vip, "status": status, "ttft_s": ttft_s,
            "slo_ttft_target_s": target, "policy_actions": list(actions),
            "estimated_ttft_s": estimate}


def test_admitted_realtime_and_vip_attainment():
    rows = [row(), row(ttft_s=0.3),  # admitted realtime: one on time, one late
            row(actions=["demote:deadline"], priority="batch"),  # demoted: a miss
            row(status="rejected", ttft_s=None, actions=["refuse:deadline"]),  # not admitted
            row(priority="batch"),  # not realtime
            # late even on an idle engine: served best effort at once, not admitted
            row(actions=["demote:unattainable"], priority="batch", ttft_s=0.3),
            row(vip=True), row(vip=True, status="rejected", ttft_s=None,
                                 actions=["refuse:deadline"])]  # a refused VIP: a miss
    assert admitted_attainment(rows) == {"admitted_realtime": 3,
                                         "admitted_realtime_attainment": 1 / 3,
                                         "best_effort": 1,
                                         "vip": 2, "vip_attainment": 0.5}


def test_miss_prediction_precision_and_recall():
    rows = [row(ttft_s=0.3, estimate=0.25),  # predicted (0.25 > 1.0 x 0.2) and missed
            row(ttft_s=0.1, estimate=0.21),  # predicted, made it: a false alarm
            row(ttft_s=0.3, estimate=0.1),  # missed, not predicted
            row(ttft_s=0.1, estimate=0.17),  # neither (within the default margin, 1.0)
            row(ttft_s=0.1, estimate=None),  # no estimate: not judged
            row(status="rejected", ttft_s=None, estimate=0.5)]  # not served: not judged
    assert miss_prediction(rows) == {"judged": 4, "predicted_misses": 2, "misses": 2,
                                     "precision": 0.5, "recall": 0.5}
    # with the server's margin 0.8 the check would refuse 0.17 > 0.16 too
    assert miss_prediction(rows, 0.8) == {"judged": 4, "predicted_misses": 3, "misses": 2,
                                          "precision": 1 / 3, "recall": 0.5}
    assert miss_prediction([row(estimate=0.1)])["precision"] is None


def test_retries_after_retry_after_are_scored_on_their_own():
    refused = Result(0, 0.0, PROMPT, ASK)
    refused.fail("deadline", 429)
    refused.retry = served()
    late = Result(1, 0.0, PROMPT, ASK)
    late.fail("deadline", 429)
    late.retry = served(ttft_s=TARGET_S * 2)
    assert retries({"realtime": [refused, late, served()]}) == {
        "retried": 2, "retry_on_time": 0.5, "deferred_retried": 0}
    assert retries({"realtime": [served()]}) == {"retried": 0, "retry_on_time": None,
                                                 "deferred_retried": 0}
    # a deferred best-effort request is never on time: counted apart, not as a miss
    deferred = Result(2, 0.0, PROMPT, ASK)
    deferred.fail("unattainable", 429)
    deferred.retry = served(ttft_s=TARGET_S * 3)
    assert retries({"realtime": [refused, deferred]}) == {
        "retried": 2, "retry_on_time": 1.0, "deferred_retried": 1}


def test_prediction_accuracy_of_served_requests():
    rows = [dict(row(ttft_s=0.1), predicted_ttft_s=0.11, predicted_ttft_p90_s=0.2),  # 10%
            dict(row(ttft_s=0.2), predicted_ttft_s=0.1, predicted_ttft_p90_s=0.15),  # 50%
            dict(row(ttft_s=0.4), predicted_ttft_s=0.5, predicted_ttft_p90_s=0.6),  # 25%
            dict(row(status="rejected", ttft_s=None), predicted_ttft_s=0.1,
                 predicted_ttft_p90_s=0.2)]
    got = prediction_accuracy(rows)
    assert got["predicted"] == 3 and got["ttft_p90_coverage"] == pytest.approx(2 / 3)
    assert got["ttft_mape_p50"] == pytest.approx(0.25)


def test_server_rows_read_back_an_infinite_estimate(monkeypatch):
    """The admin API sends a non-finite double as "Infinity" (JSON has none); the 5x
    surge's first round met one (a request the deadline check found could never be
    served in time) and the scoring's comparison then raised a TypeError."""
    from bench.policy import surge_server

    columns = ["priority", "vip", "status", "ttft_s", "slo_ttft_target_s", "policy_actions",
               "estimated_ttft_s", "predicted_ttft_s", "predicted_ttft_p90_s"]
    answers = iter([{}, {"columns": columns, "rows": [
        ["realtime", False, "ok", 0.3, 0.2, [], "Infinity", 0.25, "NaN"]]}])
    monkeypatch.setattr(surge_server, "admin", lambda *args: next(answers))
    (row,) = surge_server.server_rows("http://unused", 0.0, 1.0)
    assert row["estimated_ttft_s"] == float("inf") and math.isnan(row["predicted_ttft_p90_s"])
    assert miss_prediction([row])["precision"] == 1.0


def test_every_surge_figure_names_the_machine_it_ran_on():
    """A base rate chosen on one machine is far over capacity on a slower one, so the
    bench prints the CPU, its vCPUs and the vector extensions vLLM's CPU backend uses."""
    import os

    from bench.common import machine

    line = machine()
    assert f"{os.cpu_count()} vCPU" in line
    flags = open("/proc/cpuinfo").read()
    assert ("avx2" in line) == (" avx2" in flags)
    assert ("avx512f" in line) == (" avx512f" in flags)


def test_base_busy_is_the_share_of_the_base_phase_the_engine_spent_stepping():
    """The bench's query, on the trace log's own `engine_stats` table: the seconds of
    stepping per second over the window (a second whose steps overrun it counts 1)."""
    from datetime import datetime, timezone

    import duckdb

    from bench.policy.surge_server import BUSY_SQL
    from observe.schema import create_schema

    conn = duckdb.connect(":memory:")
    create_schema(conn)
    for second, mean_step_s, steps in ((100, 0.02, 30), (101, 0.15, 10), (102, 0.0, 0),
                                       (200, 0.5, 10)):  # outside the window
        conn.execute("INSERT INTO engine_stats (ts, mean_step_s, steps) VALUES (?, ?, ?)",
                     [datetime.fromtimestamp(second, tz=timezone.utc), mean_step_s, steps])
    busy = conn.execute(BUSY_SQL.format(start=99.5, end=102.5)).fetchone()[0]
    assert busy == pytest.approx((0.6 + 1.0 + 0.0) / 3)  # 1.5 s of steps in 101: 1
