"""Prometheus native histograms (`serve --native-histograms`): the bucket arithmetic
against its definition, the protobuf exposition against hand-encoded bytes, and the
whole format against Debian's Prometheus 2.42 with its native-histograms feature on,
which must ingest every family, keep the latency histograms as native ones and answer
`histogram_quantile` exactly as `observe.metrics.exponential.quantile` computes it."""

from __future__ import annotations

import contextlib
import math
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary

from observe import registry as R
from observe.metrics import RequestMetrics, create_prometheus_export
from observe.metrics import protobuf as P
from observe.metrics.exponential import (
    Exponential,
    bucket_index,
    quantile,
    spans_and_deltas,
    upper_bound,
)
from tests import conftest
from tests.prometheus_server import query, running_prometheus, until

PROTOBUF_ACCEPT = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                   "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
TTFT = R.TTFT.prom_name


@pytest.mark.parametrize("schema", [-2, 0, 1, 3, 8])
def test_a_value_falls_in_the_first_bucket_whose_upper_bound_reaches_it(schema):
    rng = random.Random(schema)
    values = [10 ** rng.uniform(-6, 3) for _ in range(2000)] + [0.5, 1.0, 2.0, 1024.0, 0.125]
    for value in values:
        index = bucket_index(value, schema)
        upper, lower = upper_bound(index, schema), upper_bound(index - 1, schema)
        if min(abs(value / upper - 1), abs(value / lower - 1)) < 1e-12:
            continue  # on a bound, within float error of 2^(i/2^s): either side is fair
        assert lower < value <= upper, (value, index)
    step = 1 << max(-schema, 0)  # schema -2: bounds 16 apart, so 2^-8, 2^-4, 1, 16, ...
    for power in range(-12, 13, step):  # a bound is inclusive
        assert upper_bound(bucket_index(2.0 ** power, schema), schema) == 2.0 ** power


def test_sparse_buckets_encode_as_spans_and_deltas():
    spans, deltas = spans_and_deltas({-3: 1, -2: 2, 0: 5, 5: 1})
    assert spans == [(-3, 2), (1, 1), (4, 1)]  # -3..-2, a gap of 1, 0, a gap of 4, 5
    assert deltas == [1, 1, 3, -4]
    assert spans_and_deltas({}) == ([], [])


def test_quantile_is_linear_inside_the_bucket_where_the_rank_falls():
    h = Exponential(schema=0)  # bounds 1, 2, 4, 8: bucket i is (2^(i-1), 2^i]
    for value in (1.5, 1.2, 2.0, 3.0):
        h.observe(value)
    assert h.counts == {1: 3, 2: 1}
    assert quantile(0.5, h) == pytest.approx(1 + (2 - 1) * (2 / 3))  # rank 2 of 3 in (1, 2]
    assert quantile(1.0, h) == 4.0
    h.observe(0.0)  # the zero bucket spans [0, threshold]
    assert h.zero == 1 and quantile(0.1, h) == pytest.approx(0.5 * 2.0 ** -128)
    assert math.isnan(quantile(0.5, Exponential()))


def test_a_gauge_family_encodes_byte_for_byte():
    body = P.family("g", "h", P.GAUGE, [P.gauge(P.labels([("a", "b"), ("e", "")]), 1.5)])
    label = "0a06" "0a0161" "120162"  # LabelPair{name "a", value "b"}; e="" is left out
    value = "1209" "09" "000000000000f83f"  # Gauge{value 1.5}
    metric = "2213" + label + value
    assert body.hex() == "1d" "0a0167" "120168" "1801" + metric


def test_a_native_histogram_encodes_zigzag_spans_and_deltas():
    h = Exponential(schema=3)
    h.counts = {-1: 2, 0: 1}
    body = P.histogram(b"", 3, 2.5, [(1.0, 3), (math.inf, 3)], h)
    assert body.hex() == (
        "3a2f"  # Metric.histogram (field 7), 47 bytes
        "0803" "110000000000000440"  # count 3, sum 2.5
        "1a0b" "0803" "11000000000000f03f"  # bucket le=1: 3 (+Inf left to the count)
        "2806" "31000000000000f037" "3800"  # schema 3 (zigzag 6), threshold 2^-128, zero 0
        "6204" "0801" "1002"  # span: offset -1 (zigzag 1), length 2
        "6804" "6801")  # deltas 2 (zigzag 4), -1 (zigzag 1)


def test_text_is_unchanged_and_protobuf_offered_only_with_native_buckets():
    def expose(exponential: bool, accept: str | None):
        export = create_prometheus_export(CollectorRegistry(), native=True)
        try:
            metrics = RequestMetrics(export.provider.get_meter("tailguard"), None, exponential)
            feed_latencies(metrics, [0.05, 0.2, 0.0, 1.5])
            return export.exposition(accept)
        finally:
            export.shutdown()

    assert expose(True, None) == expose(False, None) == expose(False, PROTOBUF_ACCEPT)
    body, kind = expose(True, PROTOBUF_ACCEPT)
    assert kind == P.CONTENT_TYPE and body[:1] != b"#"
    for accept in ("text/plain;version=0.0.4", "", None, "application/vnd.google.protobuf;"
                   "proto=io.prometheus.client.MetricFamily;encoding=text",
                   "text/plain;proto=io.prometheus.client.MetricFamily;encoding=delimited"):
        assert not P.wants_protobuf(accept), accept


def feed_latencies(metrics: RequestMetrics, values, bucket: str = "0-1k") -> None:
    ttft = metrics.instruments[TTFT]
    for value in values:
        ttft.record(value, {R.LABEL_CONTEXT_BUCKET: bucket})
        metrics.instruments[R.CONTEXT_TOKENS.prom_name].record(300)


@contextlib.contextmanager
def serving(export):
    """`export`'s /metrics on loopback, answering each scrape's Accept header in kind."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body, kind = export.exposition(self.headers.get("Accept"))
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", conftest.free_port()), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield type("Target", (), {"url": f"http://127.0.0.1:{httpd.server_address[1]}"})
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_prometheus_ingests_native_histograms_and_every_client_family(tmp_path):
    registry = CollectorRegistry()
    export = create_prometheus_export(registry, native=True)
    metrics = RequestMetrics(export.provider.get_meter("tailguard"), None, True)
    Counter("demo_events", "events", ["who"], registry=registry).labels('ü "x"\n').inc(7)
    Gauge("demo_level", "level", registry=registry).set(-2.5)
    Histogram("demo_seconds", "classic", buckets=(0.1, 1), registry=registry).observe(0.5)
    Summary("demo_size", "summary", registry=registry).observe(3)
    Info("demo_build", "info", registry=registry).info({"version": "1"})
    rng = random.Random(7)
    first = [rng.lognormvariate(-1.5, 0.8) for _ in range(500)]
    with serving(export) as target, running_prometheus(target, tmp_path, native=True) as prom:
        feed_latencies(metrics, first)
        count = f'histogram_count({TTFT}{{context_bucket="0-1k"}})'
        until(lambda: query(prom, count).get("") == 500, "the native count", 30)
        native = Exponential()
        for value in first:
            native.observe(value)
        for q in (0.5, 0.9, 0.99):
            got = query(prom, f'histogram_quantile({q}, {TTFT}{{context_bucket="0-1k"}})')
            assert got[""] == pytest.approx(quantile(q, native), rel=1e-9)
        assert query(prom, f'histogram_sum({TTFT}{{context_bucket="0-1k"}})')[""] == \
            pytest.approx(sum(first))
        assert query(prom, f"count({TTFT}_bucket)") == {}  # native only: no bucket series
        tokens = R.CONTEXT_TOKENS.prom_name  # CONTRACT names its bounds: classic
        # (Prometheus 2.42 writes a whole bound read from protobuf as "1024.0")
        assert query(prom, f'{tokens}_bucket{{le="1024.0"}}')[""] == 500
        assert query(prom, 'demo_events_total{who="ü \\"x\\"\\n"}')[""] == 7
        assert query(prom, "demo_level")[""] == -2.5
        assert query(prom, 'demo_seconds_bucket{le="1.0"}')[""] == 1
        assert query(prom, "demo_size_count")[""] == 1
        assert query(prom, 'demo_build_info{version="1"}')[""] == 1
    export.shutdown()
