"""Seed 000's length classes, exactly: the re-bucketing rule (p25 / p75, each move
clamped to 20%), its 5 s windows, the boundaries each request is classed by (its row,
its span attribute) and the gauge; and the limiter's short-class-first order when the
`length_class_order` setting asks for it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from observe import registry as R
from observe.record import RequestRecord
from serving.admission import Admission
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.guard.live_predictor import PredictionService
from serving.limiter import Limiter
from slo.policy.conditions import PolicyConfig
from slo.policy.decisions import Decisions
from slo.policy.length_classes import LengthClasses, class_of, rebucket

RT = R.PRIORITY_REALTIME


@pytest.mark.parametrize("case,bounds,lengths,expected", [
    ("inside the clamp: the window's p25 and p75", (256, 512), [200, 240, 300, 500, 520],
     (240, 500)),
    ("shorter prompts: each boundary moves down by at most 20%", (256, 512), [100] * 8,
     (205, 410)),
    ("longer prompts: each boundary moves up by at most 20%", (256, 512), [1000] * 8,
     (307, 614)),
    ("one length for everyone: the high boundary stays above the low one", (100, 110),
     [105] * 8, (105, 106)),
    ("a move never goes below one token", (1, 2), [1] * 8, (1, 2)),
])
def test_rebucketing_follows_the_seed(case, bounds, lengths, expected):
    assert rebucket(bounds, lengths) == expected, case


@pytest.mark.parametrize("tokens,cls", [(1, 0), (256, 0), (257, 1), (512, 1), (513, 2)])
def test_a_prompt_is_classed_by_the_boundaries_up_to_and_including_each(tokens, cls):
    assert class_of(tokens, (256, 512)) == cls
    assert R.batch_bucket(tokens, (256, 512)) == R.batch_bucket(tokens)
    assert R.batch_bucket(tokens) == ("0-256", "256-512", "512+")[cls]


def test_windows_of_five_seconds_each_move_the_boundaries_once():
    classes = LengthClasses()
    seen = [classes.observe(1000, t) for t in (0.0, 1.0, 2.0, 3.0, 4.0, 4.5, 4.9, 4.95)]
    assert seen == [(256, 512)] * 8  # the first window: the starting boundaries
    # the first window closes as the next prompt arrives: that one is classed by the move
    assert classes.observe(1000, 5.0) == (307, 614) and classes.moves == 1
    for t in (5.5, 6, 7, 8, 9, 9.5, 9.9):
        classes.observe(1000, t)
    classes.roll(10.0)  # the policy loop's tick closes a window with no arrival
    assert classes.bounds == (368, 737) and classes.moves == 2


def test_a_window_with_few_prompts_or_none_moves_nothing():
    classes = LengthClasses()
    for t in (0.0, 1.0, 2.0):
        classes.observe(5000, t)
    classes.roll(5.0)  # 2 prompts in the first window (fewer than 8): no move
    classes.roll(100.0)  # 19 idle windows: no move, and the next one starts at 100 s
    assert classes.bounds == (256, 512) and classes.moves == 0
    for i in range(8):
        classes.observe(1000, 100.0 + i * 0.5)
    classes.roll(104.99)
    assert classes.bounds == (256, 512)
    classes.roll(105.0)
    assert classes.bounds == (307, 614)


@pytest.mark.parametrize("kwargs", [dict(bounds=(512, 256)), dict(bounds=(0, 5)),
                                    dict(window_s=0), dict(max_move=1.0),
                                    dict(min_samples=0)])
def test_impossible_settings_fail_at_construction(kwargs):
    with pytest.raises(ValueError):
        LengthClasses(**kwargs)


def test_the_order_setting_must_be_a_boolean():
    with pytest.raises(ValueError, match="length_class_order must be true or false"):
        PolicyConfig(length_class_order="yes")


def _admission(decisions: Decisions, limit: int = 8) -> Admission:
    service = PredictionService(None, None, retrain_interval_s=0)
    adm = Admission(LoadTracker(EngineSecond()), service, Limiter(limit), FaultInjector(),
                    lambda tokens: 60.0)
    adm.publish(decisions)
    return adm


def test_each_request_keeps_the_boundaries_it_was_classed_by_in_its_row():
    adm = _admission(Decisions(8))
    adm.length_classes = LengthClasses(min_samples=1, window_s=1e-9)
    recs = [RequestRecord(f"r{i}", 0.0, "text_completion") for i in range(2)]
    for rec in recs:
        rec.prompt_tokens = 300  # as the HTTP layer sets it once the prompt is tokenized
        asyncio.run(adm.admit(rec, {"prompt_token_ids": [1] * 300}, 300, 4))
        adm.release(None)
    rows = [rec.row(_Clock()) for rec in recs]
    # the second was classed after the first window's move: p25 = p75 = 300, the high
    # boundary clamped to 512 x 0.8
    assert [(r["length_class_low"], r["length_class_high"], r["batch_bucket"])
            for r in rows] == [(256, 512, "256-512"), (300, 410, "0-300")]


def test_a_request_refused_before_admission_has_no_boundaries():
    row = RequestRecord("r", 0.0, "text_completion").row(_Clock())
    assert (row["length_class_low"], row["length_class_high"]) == (None, None)


class _Clock:
    def datetime(self, monotonic: float):
        return None


def test_with_length_class_order_a_short_prompt_passes_a_long_one_due_earlier():
    async def scenario(ordered: bool):
        adm = _admission(Decisions(1, length_class_order=ordered), limit=1)
        await adm.limiter.acquire(RT)  # the one slot is taken
        order: list[str] = []

        async def one(name: str, tokens: int, arrival: float):
            rec = RequestRecord(name, arrival, "text_completion")
            await adm.admit(rec, {"prompt_token_ids": [1] * tokens}, tokens, 4)
            order.append(name)
        long_first = asyncio.create_task(one("long", 2000, 0.0))  # due first
        await asyncio.sleep(0.01)
        short = asyncio.create_task(one("short", 50, 1.0))
        await asyncio.sleep(0.01)
        ahead = adm.work_ahead(RT, adm.load.admit(0), 0.0, 61.0, 0).prefill_tokens
        adm.load.release(0)
        for _ in range(2):
            adm.limiter.release()
            await asyncio.sleep(0.01)
        await asyncio.gather(long_first, short)
        return order, ahead
    assert asyncio.run(scenario(False)) == (["long", "short"], 2050)
    # ordered: the short one is ahead of the long one; a newcomer of class 0 due at 61 s
    # waits behind the short one only
    assert asyncio.run(scenario(True)) == (["short", "long"], 50)


def _result(tokens: int, ttft: float | None, status: str = "ok"):
    from loadgen.runner import Result

    return Result(0, 0.0, tokens, 4, status=status, prompt_tokens=tokens, ttft_s=ttft)


def test_the_ab_bench_splits_ttft_by_class_and_reports_b_over_a_per_round(capsys):
    from bench.policy.server_ab import GROUPS, report, ttft_figures

    by_key = {"realtime": [_result(100, 0.1), _result(300, 0.3), _result(600, 0.6)],
              "vip": [_result(100, 0.05)],
              "batch": [_result(100, 0.2), _result(100, None, "error")]}
    got = ttft_figures(by_key)
    assert [got[f"{g}_n"] for g in GROUPS] == [5, 3, 1, 1, 1]
    assert got["short_p50"] == pytest.approx(0.1) and got["long_p99"] == pytest.approx(0.6)
    assert got["all_p99"] == pytest.approx(np.percentile([0.1, 0.3, 0.6, 0.05, 0.2], 99))
    assert got["vip_p99"] == pytest.approx(0.05)

    def row(rnd, side, p99, goodput, vip=1.0):
        figures = {f"{g}_{k}": 0.1 for g in GROUPS for k in ("p50", "p99")}
        figures.update({f"{g}_n": 1 for g in GROUPS})
        return {"round": rnd, "side": side, "first": True, "offered": 1, "ok": 1,
                "refused": 0, "goodput_rps": goodput, **figures, "all_p99": p99,
                "admitted_realtime_attainment": 0.9, "admitted_realtime": 10,
                "vip_attainment": vip, "vip": 4}
    medians = report([row(0, "A", 1.0, 2.0, 0.5), row(0, "B", 0.9, 2.0, 0.75),
                      row(1, "B", 0.7, 2.2), row(1, "A", 1.0, 2.0)])
    assert medians["all_p99"] == pytest.approx(0.8)
    assert medians["goodput_rps"] == pytest.approx(1.05) and medians["short_p99"] == 1.0
    assert medians["vip_attainment"] == pytest.approx(1.25)
    out = capsys.readouterr().out
    assert "all_p99 B/A per round: [0.9, 0.7], median 0.800" in out
    assert "| 0 | A | yes | 1 | 1 | 0 | 2.00 | 90.0% (10) | 50.0% (4) |" in out
