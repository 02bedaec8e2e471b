"""The latency predictor watched live: every finished request that carries a
prediction counts its p50 error and p90 coverage per context bucket on /metrics, by
the one accuracy rule (`slo.predict.accuracy`) that the CLI and the console run as
SQL; a test holds the live numbers equal to the SQL over the same requests."""

from __future__ import annotations

import itertools
import random
from functools import partial

import pytest

from observe import registry as R
from observe.record import LatencyPrediction, RequestRecord
from observe.stats import EngineTimes, WallClock
from observe.tracelog import TraceLog
from serving.observer import Observer
from slo.predict.accuracy import judge_served, served_accuracy_sql
from tests.prom_samples import fresh_metrics, sample_value

NAN = float("nan")
_IDS = itertools.count()


class _NoSpans:
    def finish(self, rec, span) -> None:
        pass


@pytest.fixture
def served():
    """An observer over a fresh Prometheus registry and an in-memory trace log."""
    with fresh_metrics() as (metrics, registry), TraceLog(":memory:") as log:
        yield Observer(log, _NoSpans(), metrics, WallClock(offset=0.0)), registry


def _record(prompt_tokens: int, ttft: float | None, output_tokens: int = 1,
            decode: float = 0.0, prediction: LatencyPrediction | None = None,
            status: str = R.STATUS_OK) -> RequestRecord:
    """A finished request at t=100 s: TTFT `ttft`, then `decode` s for the rest."""
    rec = RequestRecord(f"r{next(_IDS)}", arrival=100.0, endpoint="chat",
                        prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                        prediction=prediction)
    if ttft is not None:
        first = 100.0 + ttft
        rec.engine = EngineTimes(100.0, 100.0, first, first + decode)
        rec.first_token = first
    rec.end = 101.0 + (ttft or 0) + decode
    rec.status = status
    return rec


def _pred(ttft: float, ttft_p90: float, tpot: float = 0.1, tpot_p90: float = 0.2):
    return LatencyPrediction(ttft, ttft_p90, tpot, tpot_p90, 1.0, "test")


def _finish(observer: Observer, *records: RequestRecord) -> None:
    for rec in records:
        observer.finish(rec, None)


SHORT, LONG = {"context_bucket": "0-1k"}, {"context_bucket": "1k-4k"}


def test_a_served_request_counts_its_error_and_coverage_per_bucket(served):
    observer, registry = served
    # TTFT 0.5 s against p50 0.25 / p90 0.75; TPOT 0.125 s against 0.125 / 0.0625
    short = _record(100, 0.5, output_tokens=5, decode=0.5,
                    prediction=_pred(0.25, 0.75, 0.125, 0.0625))
    _finish(observer, short, _record(2000, 1.0, prediction=_pred(0.5, 0.75)))  # no TPOT
    v = partial(sample_value, registry)
    assert v("tailguard_prediction_ttft_judged_total", **SHORT) == 1
    assert v("tailguard_prediction_ttft_within_p90_total", **SHORT) == 1
    assert v("tailguard_prediction_ttft_error_ratio_count", **SHORT) == 1
    assert v("tailguard_prediction_ttft_error_ratio_sum", **SHORT) == 0.5
    assert v("tailguard_prediction_ttft_error_ratio_bucket", le="0.5", **SHORT) == 1
    assert v("tailguard_prediction_ttft_error_ratio_bucket", le="0.3", **SHORT) == 0
    assert v("tailguard_prediction_tpot_judged_total", **SHORT) == 1
    assert v("tailguard_prediction_tpot_within_p90_total", **SHORT) == 0  # a series at 0
    assert v("tailguard_prediction_tpot_error_ratio_sum", **SHORT) == 0.0
    assert v("tailguard_prediction_ttft_judged_total", **LONG) == 1
    assert v("tailguard_prediction_ttft_within_p90_total", **LONG) == 0
    assert v("tailguard_prediction_ttft_error_ratio_sum", **LONG) == 0.5
    assert v("tailguard_prediction_tpot_judged_total", **LONG) is None


@pytest.mark.parametrize("rec", [
    _record(100, 0.5, prediction=_pred(0.25, 0.75), status=R.STATUS_REJECTED),
    _record(100, 0.5, prediction=_pred(0.25, 0.75), status=R.STATUS_ERROR),
    _record(100, None, prediction=_pred(0.25, 0.75)),
    _record(100, 0.5, output_tokens=5, decode=0.5),
    _record(100, 0.5, prediction=_pred(NAN, NAN, NAN, NAN)),
], ids=["a rejected request is not judged", "a failed request is not judged",
        "a request without a first token is not judged",
        "a request no model predicted is not judged", "a prediction of no number is none"])
def test_requests_the_rule_does_not_judge_leave_every_series_alone(served, rec):
    observer, registry = served
    _finish(observer, rec)
    names = {s.name for family in registry.collect() for s in family.samples}
    assert not {n for n in names if n.startswith("tailguard_prediction_")}


def test_a_prediction_without_a_p90_counts_its_error_but_no_coverage(served):
    observer, registry = served
    _finish(observer, _record(100, 0.5, prediction=_pred(0.25, NAN)))
    assert sample_value(registry, "tailguard_prediction_ttft_error_ratio_count", **SHORT) == 1
    assert sample_value(registry, "tailguard_prediction_ttft_judged_total", **SHORT) is None


def _random_records(rng: random.Random, n: int) -> list[RequestRecord]:
    out = []
    for _ in range(n):
        tokens = rng.choice((1, 2, 3, 5))
        pred = None if rng.random() < 0.1 else _pred(
            rng.uniform(0.05, 1), rng.uniform(0.05, 2), rng.uniform(0.005, 0.05),
            rng.uniform(0.005, 0.08))
        status = R.STATUS_OK if rng.random() < 0.9 else R.STATUS_REJECTED
        out.append(_record(rng.choice((100, 900, 2000, 5000)), rng.uniform(0.05, 1.5), tokens,
                           rng.uniform(0.01, 0.2) * (tokens - 1), pred, status))
    return out


def test_the_live_metrics_equal_the_sql_rule_per_context_bucket(served):
    observer, registry = served
    _finish(observer, *_random_records(random.Random(5), 300))
    observer.tracelog.flush()
    sql = served_accuracy_sql(by="context_bucket")
    rows = observer.tracelog.query(sql).rows
    assert {r[0] for r in rows} == {"0-1k", "1k-4k", "4k-32k"}
    for bucket, requests, ttft_mape, ttft_cov, tpot_mape, tpot_cov in rows:
        labels = {R.LABEL_CONTEXT_BUCKET: bucket}
        for target, mape, coverage in (("ttft", ttft_mape, ttft_cov),
                                       ("tpot", tpot_mape, tpot_cov)):
            base = f"tailguard_prediction_{target}_"
            count = sample_value(registry, base + "error_ratio_count", **labels)
            total = sample_value(registry, base + "error_ratio_sum", **labels)
            within = sample_value(registry, base + "within_p90_total", **labels)
            judged = sample_value(registry, base + "judged_total", **labels)
            assert total / count == pytest.approx(mape, rel=1e-9), (bucket, target)
            assert within / judged == pytest.approx(coverage, rel=1e-12), (bucket, target)
        assert sample_value(registry, "tailguard_prediction_ttft_error_ratio_count",
                      **labels) == requests


def test_the_rule_judges_ttft_and_tpot_apart():
    judged = judge_served(_record(100, 0.5, output_tokens=3, decode=0.5,
                                  prediction=_pred(0.25, 0.75, 0.25, 0.5)))
    assert [(j.target, j.error, j.within_p90) for j in judged] == [
        ("ttft_s", 0.5, True), ("tpot_s", 0.0, True)]
