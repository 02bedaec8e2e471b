"""OTLP export: the registry's spans and metrics reach a collector, decoded exactly,
over OTLP/HTTP and OTLP/gRPC (loopback receivers in tests/otlp_receiver.py)."""

from __future__ import annotations

import os
import re
import socket
import sys
import time

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from observe import registry as R
from observe.metrics import RequestMetrics
from observe.otlp import (
    DEFAULT_EXPORT_INTERVAL_S,
    PROTOCOL_GRPC,
    PROTOCOL_HTTP,
    OtlpConfig,
    create_otlp_metric_reader,
    create_otlp_span_processor,
    otlp_config_from,
)
from observe.settings import OTEL_EXPORTER_OTLP_ENDPOINT as ENV_ENDPOINT
from observe.settings import OTEL_EXPORTER_OTLP_HEADERS as ENV_HEADERS
from observe.settings import OTEL_EXPORTER_OTLP_PROTOCOL as ENV_PROTOCOL
from observe.settings import OTEL_METRIC_EXPORT_INTERVAL as ENV_EXPORT_INTERVAL_MS
from observe.stats import EngineSnapshot, WallClock
from observe.tracing import RequestSpans, create_tracer_provider
from tests.conftest import free_port
from tests.otlp_receiver import GrpcReceiver, HttpReceiver
from tests.test_registry import _finished_record

RECEIVERS = {PROTOCOL_HTTP: HttpReceiver, PROTOCOL_GRPC: GrpcReceiver}
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CLOCK = WallClock(offset=1_700_000_000.0)


@pytest.fixture(autouse=True)
def no_otel_env(monkeypatch):
    """Fresh state: no OTEL_* variable of the surrounding shell reaches the SDK."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture(params=sorted(RECEIVERS))
def collector(request):
    with RECEIVERS[request.param]() as receiver:
        yield receiver, OtlpConfig(receiver.endpoint, request.param,
                                   headers={"Authorization": "Bearer t0ken"}, timeout_s=2)


# --- spans ------------------------------------------------------------------------------
def test_a_request_span_tree_reaches_the_collector_and_the_trace_log(collector):
    receiver, config = collector
    rows = []
    provider = create_tracer_provider(rows.append)
    provider.add_span_processor(create_otlp_span_processor(config))
    spans = RequestSpans(provider, CLOCK)
    rec = _finished_record()
    spans.finish(rec, spans.start(rec, {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}))
    assert provider.force_flush()
    provider.shutdown()

    seen = {s.name: s for s in receiver.spans()}
    assert receiver.span_names() == sorted([R.SPAN_REQUEST, *R.PHASE_SPANS])
    root = seen[R.SPAN_REQUEST]
    assert (root.trace_id, root.parent_span_id, root.kind) == (CALLER_TRACE, CALLER_SPAN, 2)
    for name in R.PHASE_SPANS:
        assert (seen[name].trace_id, seen[name].parent_span_id) == (CALLER_TRACE, root.span_id)
        assert seen[name].attributes[R.ATTR_REQUEST_ID] == "r1"
    assert {s.span_id for s in seen.values()} == {row["span_id"] for row in rows}
    assert root.resource["service.name"] == "tailguard"
    assert {k: root.attributes[k] for k in (
        R.ATTR_REQUEST_ID, R.ATTR_OPERATION, R.ATTR_PROVIDER, R.ATTR_REQUEST_MODEL,
        R.ATTR_INPUT_TOKENS, R.ATTR_OUTPUT_TOKENS, R.ATTR_CONTEXT_BUCKET, R.ATTR_STATUS,
        R.ATTR_HTTP_STATUS, R.ATTR_ITERATIONS, R.ATTR_POLICY_ACTIONS)} == {
        R.ATTR_REQUEST_ID: "r1", R.ATTR_OPERATION: "chat", R.ATTR_PROVIDER: "vllm",
        R.ATTR_REQUEST_MODEL: "m", R.ATTR_INPUT_TOKENS: 2000, R.ATTR_OUTPUT_TOKENS: 11,
        R.ATTR_CONTEXT_BUCKET: "1k-4k", R.ATTR_STATUS: "ok", R.ATTR_HTTP_STATUS: 200,
        R.ATTR_ITERATIONS: 1, R.ATTR_POLICY_ACTIONS: []}
    assert root.attributes[R.ATTR_TTFT] == pytest.approx(0.145)
    assert seen[R.SPAN_SAMPLING].attributes[R.ATTR_SAMPLING_STEPS] == 1
    durations = {name: (s.end_ns - s.start_ns) / 1e9 for name, s in seen.items()}
    assert durations == pytest.approx({R.SPAN_REQUEST: 0.70, R.SPAN_QUEUE: 0.02,
                                       R.SPAN_PREFILL: 0.10, R.SPAN_DECODE: 0.50,
                                       R.SPAN_SAMPLING: 0.004}, abs=1e-6)
    assert receiver.headers[0]["authorization"] == "Bearer t0ken"


def test_gzip_from_the_standard_env_var_is_decoded(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    with HttpReceiver() as receiver:
        provider = create_tracer_provider()
        provider.add_span_processor(create_otlp_span_processor(OtlpConfig(receiver.endpoint)))
        provider.get_tracer("t").start_span(R.SPAN_STEP).end()
        provider.force_flush()
        provider.shutdown()
    assert receiver.span_names() == [R.SPAN_STEP]
    assert receiver.headers[0]["content-encoding"] == "gzip"


# --- metrics ----------------------------------------------------------------------------
def _snapshot() -> EngineSnapshot:
    return EngineSnapshot(ts=1.0, running=3, waiting=2, kv_cache_usage=0.5, preemptions=0,
                          prompt_tokens=0, generation_tokens=0, steps=0, mean_batch_size=0,
                          max_batch_size=0, mean_step_s=None, mean_sampling_s=None, finished=0)


def test_registry_metrics_reach_the_collector_and_prometheus_with_exact_values(collector):
    receiver, config = collector
    prometheus, otlp = CollectorRegistry(), create_otlp_metric_reader(config)
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader(disable_target_info=True, registry=prometheus),
                        otlp], resource=create_tracer_provider().resource)
    metrics = RequestMetrics(provider.get_meter("tailguard"))
    for _ in range(3):
        metrics.record_request(_finished_record())
    metrics.record_step(4)
    metrics.record_step(8)
    metrics.record_engine(_snapshot())
    # Flush the OTLP reader alone: a MeterProvider.force_flush() would also queue a
    # collection in the Prometheus reader, and the next scrape would repeat every series.
    assert otlp.force_flush()
    assert [s.value for family in prometheus.collect() for s in family.samples
            if s.name == R.REQUESTS.prom_name] == [3]
    provider.shutdown()  # unregisters the Prometheus reader

    recorded = [R.REQUESTS, *R.LATENCY_METRICS, R.CONTEXT_TOKENS, R.BATCH_SIZE,
                R.KV_CACHE_USAGE, R.RUNNING, R.WAITING]
    assert receiver.metric_names() == {m.otel_name for m in recorded}
    [requests] = receiver.last_points(R.REQUESTS.otel_name)
    assert (requests.value, requests.monotonic) == (3, True)
    assert requests.attributes == {R.LABEL_STATUS: "ok", R.LABEL_CONTEXT_BUCKET: "1k-4k",
                                   R.LABEL_PRIORITY: "realtime"}
    assert requests.resource["service.name"] == "tailguard"
    [queue] = receiver.last_points(R.QUEUE.otel_name)
    assert (queue.unit, queue.attributes, queue.count) == ("s", {R.LABEL_CONTEXT_BUCKET: "1k-4k"}, 3)
    assert queue.sum == pytest.approx(0.06)
    assert len(queue.bucket_counts) == len(R.QUEUE.buckets) + 1
    [batch] = receiver.last_points(R.BATCH_SIZE.otel_name)
    assert (batch.count, batch.sum) == (2, 12)
    gauges = {m.otel_name: receiver.last_points(m.otel_name)[0].value
              for m in (R.KV_CACHE_USAGE, R.RUNNING, R.WAITING)}
    assert gauges == {R.KV_CACHE_USAGE.otel_name: 0.5, R.RUNNING.otel_name: 3,
                      R.WAITING.otel_name: 2}


# --- failure ----------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", sorted(RECEIVERS))
def test_an_unreachable_collector_costs_bounded_time_and_export_resumes(protocol):
    port = free_port()
    config = OtlpConfig(f"http://127.0.0.1:{port}", protocol, timeout_s=0.5)
    rows = []
    provider = create_tracer_provider(rows.append)
    provider.add_span_processor(create_otlp_span_processor(config))
    meters = MeterProvider(metric_readers=[create_otlp_metric_reader(config)])
    tracer = provider.get_tracer("t")
    tracer.start_span(R.SPAN_REQUEST).end()
    meters.get_meter("t").create_counter("c").add(1)
    started = time.monotonic()
    provider.force_flush()
    meters.force_flush()
    assert time.monotonic() - started < 3
    assert [row["name"] for row in rows] == [R.SPAN_REQUEST]  # the trace log is unaffected
    with RECEIVERS[protocol](port) as receiver:
        tracer.start_span(R.SPAN_STEP).end()
        provider.force_flush()
        meters.force_flush()
        provider.shutdown()
        meters.shutdown()
    assert receiver.span_names() == [R.SPAN_STEP]  # the first batch was dropped, not retried
    assert receiver.last_points("c")[0].value == 1


@pytest.mark.parametrize("protocol", sorted(RECEIVERS))
def test_a_silent_collector_costs_one_timeout_per_export(protocol):
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        config = OtlpConfig(f"http://127.0.0.1:{silent.getsockname()[1]}", protocol,
                            timeout_s=0.3)
        provider = create_tracer_provider()
        provider.add_span_processor(create_otlp_span_processor(config))
        provider.get_tracer("t").start_span(R.SPAN_REQUEST).end()
        started = time.monotonic()
        provider.force_flush()
        provider.shutdown()
        assert 0.25 < time.monotonic() - started < 0.3 + 1


# --- config -----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    pytest.param({"protocol": "http/json"}, "OTLP protocol 'http/json' is not one of "
                 "http/protobuf, grpc", id="an unknown protocol is refused"),
    pytest.param({"endpoint": "localhost:4317"}, "is not an http(s)://host:port URL",
                 id="an endpoint without a scheme is refused"),
    pytest.param({"endpoint": "ftp://collector:4318"}, "is not an http(s)://host:port URL",
                 id="a non-http scheme is refused"),
    pytest.param({"endpoint": "http://:4318"}, "is not an http(s)://host:port URL",
                 id="an endpoint without a host is refused"),
    pytest.param({"endpoint": "http://collector:43a8"}, "bad port",
                 id="a non-numeric port is refused"),
    pytest.param({"endpoint": "http://collector:99999"}, "bad port",
                 id="an out-of-range port is refused"),
    pytest.param({"endpoint": "http://collector:4318?x=1"}, "is not an http(s)://host:port URL",
                 id="a query string is refused"),
    pytest.param({"endpoint": "http://collector:4317/v1", "protocol": PROTOCOL_GRPC},
                 "a gRPC endpoint takes no path", id="a gRPC endpoint with a path is refused"),
    pytest.param({"timeout_s": 0}, "OtlpConfig.timeout_s must be > 0",
                 id="a zero timeout is refused"),
    pytest.param({"export_interval_s": -1}, "OtlpConfig.export_interval_s must be > 0",
                 id="a negative interval is refused"),
])
def test_bad_config_raises_value_error_naming_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OtlpConfig(**{"endpoint": "http://collector:4318", **kwargs})


@pytest.mark.parametrize("endpoint, protocol, expected", [
    pytest.param("http://collector:4318/", PROTOCOL_HTTP, ("http://collector:4318", True),
                 id="a trailing slash is dropped"),
    pytest.param("https://otlp.example.com/otlp", PROTOCOL_HTTP,
                 ("https://otlp.example.com/otlp", False), id="https with a path prefix is kept"),
    pytest.param("http://collector:4317", PROTOCOL_GRPC, ("http://collector:4317", True),
                 id="plain http gRPC is insecure"),
])
def test_good_config_is_normalised(endpoint, protocol, expected):
    config = OtlpConfig(endpoint, protocol, headers={"X-Api-Key": "k"})
    assert (config.endpoint, config.insecure) == expected
    assert config.headers == (("x-api-key", "k"),)
    assert config.grpc_target == config.endpoint.split("://")[1].split("/")[0]


def test_no_endpoint_anywhere_means_export_is_off():
    assert otlp_config_from() is None


def test_the_standard_env_vars_configure_export(monkeypatch):
    monkeypatch.setenv(ENV_ENDPOINT, "http://collector:4317")
    monkeypatch.setenv(ENV_PROTOCOL, PROTOCOL_GRPC)
    monkeypatch.setenv(ENV_HEADERS, "Authorization=Bearer%20abc,x-team=llm")
    monkeypatch.setenv(ENV_EXPORT_INTERVAL_MS, "5000")
    assert otlp_config_from() == OtlpConfig(
        "http://collector:4317", PROTOCOL_GRPC,
        headers=(("authorization", "Bearer abc"), ("x-team", "llm")), export_interval_s=5.0)


def test_arguments_beat_the_env_vars(monkeypatch):
    monkeypatch.setenv(ENV_ENDPOINT, "http://env:4317")
    monkeypatch.setenv(ENV_PROTOCOL, PROTOCOL_GRPC)
    config = otlp_config_from("http://arg:4318", PROTOCOL_HTTP)
    assert (config.endpoint, config.protocol) == ("http://arg:4318", PROTOCOL_HTTP)
    assert config.export_interval_s == DEFAULT_EXPORT_INTERVAL_S


@pytest.mark.parametrize("name, value, message", [
    pytest.param(ENV_PROTOCOL, "http/json", "is not one of", id="a bad env protocol is refused"),
    pytest.param(ENV_EXPORT_INTERVAL_MS, "soon", "OTEL_METRIC_EXPORT_INTERVAL='soon'",
                 id="a bad env interval is refused"),
])
def test_bad_env_vars_raise_value_error(monkeypatch, name, value, message):
    monkeypatch.setenv(ENV_ENDPOINT, "http://collector:4318")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        otlp_config_from()


def test_a_missing_exporter_package_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(ImportError, match="pip install opentelemetry-exporter-otlp-proto-http"):
        create_otlp_span_processor(OtlpConfig("http://collector:4317", PROTOCOL_GRPC))
