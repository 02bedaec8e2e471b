"""Every registry metric is exported under its contract name, with exact values."""

from __future__ import annotations

import pytest

from observe import registry as R
from observe.record import RequestRecord
from observe.stats import EngineSnapshot, EngineTimes
from tests.prom_samples import fresh_metrics, sample_value


@pytest.fixture
def exported():
    with fresh_metrics() as pair:
        yield pair


def _finished_record() -> RequestRecord:
    rec = RequestRecord("r1", arrival=100.0, endpoint="chat", model="m", prompt_tokens=2000,
                        output_tokens=11)
    rec.engine = EngineTimes(queued=100.01, scheduled=100.03, first_token=100.13,
                             last_token=100.63)
    rec.first_token, rec.end = 100.145, 100.70
    rec.tally.add(100.05, 0.02, 0.004)
    return rec


def test_every_metric_is_exported_under_its_contract_name(exported):
    metrics, registry = exported
    for metric in R.ALL_METRICS:
        labels = {label: "x" for label in metric.labels}
        instrument = metrics.instruments[metric.prom_name]
        if metric.kind == "histogram":
            instrument.record(1, labels)
        elif metric.kind == "counter":
            instrument.add(1, labels)
        else:
            instrument.set(1, labels)
    for metric in R.ALL_METRICS:
        suffix = "_count" if metric.kind == "histogram" else ""
        assert sample_value(registry, metric.prom_name + suffix) == 1, metric.prom_name


def test_a_finished_request_records_exact_phase_values(exported):
    metrics, registry = exported
    metrics.record_request(_finished_record())
    bucket = {"context_bucket": "1k-4k"}
    expected = {"tailguard_request_queue_seconds": 0.02, "tailguard_request_prefill_seconds": 0.10,
                "tailguard_request_decode_seconds": 0.50,
                "gen_ai_server_time_to_first_token_seconds": 0.145,
                "gen_ai_server_request_duration_seconds": 0.70,
                "gen_ai_server_time_per_output_token_seconds": 0.05,
                "tailguard_request_sampling_seconds": 0.004}
    for name, value in expected.items():
        assert sample_value(registry, name + "_sum", **bucket) == pytest.approx(value, abs=1e-9), name
        assert sample_value(registry, name + "_count", **bucket) == 1
    assert sample_value(registry, "gen_ai_server_time_to_first_token_seconds_bucket",
                  le="0.15", **bucket) == 1
    assert sample_value(registry, "gen_ai_server_time_to_first_token_seconds_bucket",
                  le="0.14", **bucket) == 0
    assert sample_value(registry, "tailguard_requests_total", status="ok", context_bucket="1k-4k",
                  priority="realtime") == 1
    assert sample_value(registry, "tailguard_request_context_tokens_bucket", le="2048") == 1


def test_a_rejected_request_counts_but_records_no_latency(exported):
    metrics, registry = exported
    rec = RequestRecord("r2", arrival=1.0, endpoint="chat", end=1.01)
    rec.fail(400, "invalid_json", "bad", "rejected")
    metrics.record_request(rec)
    assert sample_value(registry, "tailguard_requests_total", status="rejected") == 1
    assert sample_value(registry, "tailguard_request_errors_total", error_type="invalid_json",
                  http_status="400") == 1
    assert sample_value(registry, "gen_ai_server_request_duration_seconds_count") is None


def test_engine_gauges_take_the_last_second(exported):
    metrics, registry = exported
    metrics.record_engine(EngineSnapshot(0.0, 3, 7, 0.25, 0, 0, 0, 0, 0.0, 0, None, None, 0))
    assert sample_value(registry, "tailguard_requests_running") == 3
    assert sample_value(registry, "tailguard_requests_waiting") == 7
    assert sample_value(registry, "tailguard_kv_cache_usage_ratio") == 0.25


def test_context_bounds_include_the_seed_buckets():
    assert {1024, 4096, 32768} <= set(R.CONTEXT_TOKEN_BUCKETS)


@pytest.mark.parametrize("buckets,limit,step", [
    (R.LATENCY_BUCKETS_S, 2.0, 0.01), (R.TOKEN_LATENCY_BUCKETS_S, 0.1, 0.001)])
def test_latency_buckets_resolve_the_slo_range(buckets, limit, step):
    inside = [b for b in buckets if b <= limit]
    gaps = [round(b - a, 9) for a, b in zip(inside, inside[1:])]
    assert max(gaps) <= step + 1e-9
    assert list(buckets) == sorted(set(buckets))


@pytest.mark.parametrize("tokens,context,batch", [
    (0, "0-1k", "0-256"), (256, "0-1k", "0-256"), (257, "0-1k", "256-512"),
    (1024, "0-1k", "512+"), (1025, "1k-4k", "512+"), (4096, "1k-4k", "512+"),
    (4097, "4k-32k", "512+"), (32768, "4k-32k", "512+"), (32769, "32k+", "512+")])
def test_buckets_of_a_prompt_length(tokens, context, batch):
    assert (R.context_bucket(tokens), R.batch_bucket(tokens)) == (context, batch)


def test_names_are_unique():
    names = [m.prom_name for m in R.ALL_METRICS]
    assert len(names) == len(set(names))
    assert len(R.ALL_SPANS) == len(set(R.ALL_SPANS))
