"""Request timing derived from hand-set engine stamps."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from observe.record import RequestRecord
from observe.stats import EngineTimes, SamplingTally, WallClock


def _vllm_stats(**kw):
    base = dict(queued_ts=10.0, scheduled_ts=10.5, first_token_ts=11.0, last_token_ts=13.0,
                num_preemptions=1)
    return SimpleNamespace(**{**base, **kw})


def test_intervals_are_vllms_definitions():
    times = EngineTimes.from_vllm(_vllm_stats())
    assert (times.queue_s, times.prefill_s, times.decode_s) == (0.5, 0.5, 2.0)
    assert times.preemptions == 1


def test_a_request_never_scheduled_has_no_engine_times():
    assert EngineTimes.from_vllm(_vllm_stats(scheduled_ts=0.0)) is None
    assert EngineTimes.from_vllm(None) is None


def test_merging_engine_requests_spans_them_all():
    a = EngineTimes(1.0, 2.0, 3.0, 4.0)
    b = EngineTimes(0.5, 2.5, 2.9, 5.0, preemptions=2)
    assert a.merge(b) == EngineTimes(0.5, 2.0, 2.9, 5.0, 2)


def test_sampling_tally_sums_steps():
    tally = SamplingTally()
    tally.add(start=1.0, step_s=0.010, sampling_s=0.002)
    tally.add(start=1.1, step_s=0.020, sampling_s=0.003)
    assert (tally.steps, tally.step_s, tally.sampling_s) == (2, pytest.approx(0.03), 0.005)
    assert tally.first_sampling_start == pytest.approx(1.008)


def test_row_carries_every_contract_column():
    clock = WallClock(offset=1_000_000.0)
    rec = RequestRecord("id1", arrival=5.0, endpoint="chat", model="m", prompt_tokens=300,
                        output_tokens=5, first_token=5.25, end=6.0, max_tokens=5)
    rec.engine = EngineTimes(5.01, 5.02, 5.2, 5.6)
    rec.tally.add(5.02, 0.1, 0.01)
    row = rec.row(clock)
    assert row["arrival_ts"] == datetime.fromtimestamp(1_000_005.0, tz=timezone.utc)
    assert row["ttft_s"] == 0.25 and row["e2e_s"] == 1.0
    assert row["tpot_s"] == pytest.approx(0.4 / 4)
    assert row["iterations"] == 1 and row["avg_iter_s"] == 0.1
    assert (row["context_bucket"], row["batch_bucket"]) == ("0-1k", "256-512")
    contract = ("request_id trace_id arrival_ts model priority status http_status error_type "
                "finish_reason prompt_tokens output_tokens max_tokens context_bucket batch_bucket "
                "queue_s prefill_s decode_s sampling_s ttft_s tpot_s e2e_s iterations avg_iter_s "
                "slo_ttft_target_s slo_ok policy_actions").split()
    assert set(contract) <= set(row)


def test_a_single_token_has_no_tpot():
    rec = RequestRecord("id2", arrival=0.0, endpoint="chat", output_tokens=1)
    rec.engine = EngineTimes(0.0, 0.1, 0.2, 0.2)
    assert rec.tpot_s is None
