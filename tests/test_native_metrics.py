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


def served(feed) -> tuple[str, str]:
    """(what /metrics serves, prometheus_client's own text for the same registry)."""
    registry = CollectorRegistry()
    export = create_prometheus_export(registry, native=True)
    try:
        feed(RequestMetrics(export.provider.get_meter("tailguard")))
        return export.exposition()[0].decode(), generate_latest(registry).decode()
    finally:
        export.shutdown()


def test_the_fast_exposition_writes_what_prometheus_client_writes():
    fast, reference = served(every_instrument)
    assert fast == reference
    assert len(fast.splitlines()) > 1000


def test_the_fast_exposition_escapes_hostile_label_values_the_same_way():
    def feed(metrics):
        i = metrics.instruments
        for value in ('a"quote', "back\\slash", "new\nline", "", "ünïcode", "le", "{x}"):
            i[R.TTFT.prom_name].record(0.2, {R.LABEL_CONTEXT_BUCKET: value})
            i[R.CLIENT_REQUESTS.prom_name].add(1, {name: value
                                                   for name in R.CLIENT_REQUESTS.labels})
        i[R.TTFT.prom_name].record(0.3)  # no attributes: every label empty
        for _ in range(3):  # counts past a million read in Go's e-form
            i[R.BATCH_SIZE.prom_name].record(1.0)
        i[R.BATCH_SIZE.prom_name]._series[()][2] += 1_234_567

    fast, reference = served(feed)
    assert fast == reference
    assert 'a\\"quote' in fast and "e+06" in fast


def test_the_fast_exposition_serves_other_collectors_too():
    from prometheus_client import Counter as PromCounter

    registry = CollectorRegistry()
    export = create_prometheus_export(registry, native=True)
    try:
        PromCounter("vllm_like_total", "a collector that is not ours",
                    registry=registry).inc(3)
        RequestMetrics(export.provider.get_meter("tailguard")).instruments[
            R.TTFT.prom_name].record(0.2)
        body = export.exposition()[0].decode()
        assert "vllm_like_total 3.0" in body and f"{R.TTFT.prom_name}_count" in body
        assert sorted(body.splitlines()) == sorted(generate_latest(registry).decode().splitlines())
    finally:
        export.shutdown()
