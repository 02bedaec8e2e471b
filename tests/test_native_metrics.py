"""The natively kept metrics read on /metrics exactly as the OpenTelemetry SDK and its
Prometheus exporter serve the same measurements: every family, sample, label and
value, for every instrument of the registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from observe import registry as R
from observe.metrics import RequestMetrics, create_prometheus_export
from observe.metrics.native import Counter, Gauge, Histogram


def exposition(native: bool, feed) -> str:
    registry = CollectorRegistry()
    export = create_prometheus_export(registry, native=native)
    try:
        metrics = RequestMetrics(export.provider.get_meter("tailguard"))
        assert isinstance(metrics.instruments[R.TTFT.prom_name], Histogram) == native
        feed(metrics)
        return generate_latest(registry).decode()
    finally:
        export.shutdown()


def every_instrument(metrics: RequestMetrics) -> None:
    """Values on, between and beyond bounds, several label sets, repeats."""
    for n, metric in enumerate(R.ALL_METRICS):
        instrument = metrics.instruments[metric.prom_name]
        label_sets = [{}] if not metric.labels else [
            {name: f"v{i}-{name}" for name in metric.labels} for i in range(3)]
        for i, labels in enumerate(label_sets):
            if metric.kind == "histogram":
                bounds = metric.buckets
                for value in (bounds[0], bounds[len(bounds) // 2] * 1.001, bounds[-1] * 2,
                              0, bounds[1]):
                    instrument.record(value, labels or None)
            elif metric.kind == "counter":
                instrument.add(1, labels or None)
                instrument.add(n + i + 0.5, labels or None)
            else:
                instrument.set(0.25 * (n + i), labels or None)
                instrument.set(n + i + 0.125, labels or None)


def test_every_registry_metric_reads_the_same_either_way():
    native, sdk = exposition(True, every_instrument), exposition(False, every_instrument)
    assert native == sdk
    assert len(native.splitlines()) > 1000  # every family, every bucket


def test_values_the_sdk_ignores_are_ignored_the_same_way():
    """NaN, infinities and negatives: a histogram or counter ignores them (a NaN would
    poison its sum for good), a gauge ignores the non-finite."""
    hostile = (float("nan"), float("inf"), -float("inf"), -1.0, -0.0)

    def feed(metrics):
        i = metrics.instruments
        for value in hostile:
            i[R.TTFT.prom_name].record(value, {R.LABEL_CONTEXT_BUCKET: "0-1k"})
            i[R.REQUESTS.prom_name].add(value, {R.LABEL_STATUS: "ok",
                                                R.LABEL_CONTEXT_BUCKET: "0-1k",
                                                R.LABEL_PRIORITY: "realtime"})
            i[R.KV_CACHE_USAGE.prom_name].set(value)
        i[R.TTFT.prom_name].record(0.05, {R.LABEL_CONTEXT_BUCKET: "0-1k"})

    native = exposition(True, feed)
    assert native == exposition(False, feed)
    assert "nan" not in native.lower() and "inf\n" not in native.lower()


def test_nothing_recorded_nothing_served():
    assert exposition(True, lambda m: None) == exposition(False, lambda m: None) == ""


def test_a_request_through_record_request_reads_the_same():
    from observe.record import RequestRecord
    from observe.stats import EngineTimes

    def feed(metrics):
        rec = RequestRecord("r", 10.0, "/v1/completions", prompt_tokens=1500,
                            output_tokens=8, end=10.9, first_token=10.2)
        rec.engine = EngineTimes(10.01, 10.02, 10.2, 10.85)
        metrics.record_request(rec)
        metrics.record_client("alice", "good")
        metrics.record_prediction("ttft_s", "1k-4k", 0.25, True)
        metrics.record_step(7)
        metrics.record_loop_lag(0.0003)

    assert exposition(True, feed) == exposition(False, feed)


@pytest.mark.parametrize("kind", [Counter, Gauge, Histogram])
def test_instruments_have_the_sdk_call_shapes(kind):
    method = {Counter: "add", Gauge: "set", Histogram: "record"}[kind]
    assert callable(getattr(kind, method))
