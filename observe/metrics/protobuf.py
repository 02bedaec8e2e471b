"""The Prometheus protobuf exposition (`io.prometheus.client.MetricFamily`, delimited):
the only format in which Prometheus 2.42 reads native histograms.

Prometheus asks for it first when started with `--enable-feature=native-histograms`
and for the text format otherwise, so `/metrics` answers in kind
(`observe.metrics.instruments.MetricsExport.exposition`). The messages are written by
hand, field by field as client_model's `metrics.proto` numbers them: the server has no
compiled `metrics_pb2`, and the handful of message kinds below is all a scrape needs.
prometheus_client's families (vLLM's `vllm:*` series, the process collector) are
converted from their samples; the registry's own come from `observe.metrics.native`.
Empty label values are left out, as Prometheus reads them as absent anyway.
"""

from __future__ import annotations

import math
import struct
from functools import lru_cache
from collections.abc import Iterable, Sequence
from typing import Final

from observe.metrics.exponential import ZERO_THRESHOLD, Exponential, spans_and_deltas

CONTENT_TYPE: Final = ("application/vnd.google.protobuf; "
                       "proto=io.prometheus.client.MetricFamily; encoding=delimited")
COUNTER, GAUGE, SUMMARY, UNTYPED, HISTOGRAM, GAUGE_HISTOGRAM = range(6)
_TYPES: Final = {"counter": COUNTER, "gauge": GAUGE, "summary": SUMMARY,
                 "histogram": HISTOGRAM, "gaugehistogram": GAUGE_HISTOGRAM,
                 "info": GAUGE, "stateset": GAUGE}
_VARINT, _FIXED64, _BYTES = 0, 1, 2


def wants_protobuf(accept: str | None) -> bool:
    """Whether a scrape's Accept header offers this format, delimited (Prometheus names
    it first, with a higher q, when its native-histograms feature is on); its text and
    compact-text encodings are not served."""
    for offer in (accept or "").split(","):
        params = [part.strip() for part in offer.split(";")]
        if params[0] == "application/vnd.google.protobuf" and \
                "proto=io.prometheus.client.MetricFamily" in params and \
                "encoding=delimited" in params:
            return True
    return False


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # a negative int64 as protobuf writes it: ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# A scrape writes thousands of small varints (bucket counts, lengths, keys): looked up,
# not computed, the protobuf exposition costs a third of what it did.
_SMALL: Final = tuple(_encode_varint(i) for i in range(1 << 14))


def _varint(value: int) -> bytes:
    return _SMALL[value] if 0 <= value < 16384 else _encode_varint(value)


def _zigzag(value: int) -> int:
    return (value << 1) ^ (value >> 63)


def _key(field: int, wire: int) -> bytes:
    return _SMALL[field << 3 | wire]


def _uint(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + _varint(value)


def _sint(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + _varint(_zigzag(value))


def _double(field: int, value: float) -> bytes:
    return _key(field, _FIXED64) + struct.pack("<d", value)


def _bytes(field: int, payload: bytes) -> bytes:
    return _key(field, _BYTES) + _varint(len(payload)) + payload


def _text(field: int, value: str) -> bytes:
    return _bytes(field, value.encode())


def labels(pairs: Iterable[tuple[str, str]]) -> bytes:
    """Metric.label (field 1) for each pair with a value."""
    return b"".join(_bytes(1, _text(1, name) + _text(2, value))
                    for name, value in pairs if value)


def counter(label_bytes: bytes, value: float) -> bytes:
    return label_bytes + _bytes(3, _double(1, value))


def gauge(label_bytes: bytes, value: float) -> bytes:
    return label_bytes + _bytes(2, _double(1, value))


def untyped(label_bytes: bytes, value: float) -> bytes:
    return label_bytes + _bytes(5, _double(1, value))


def summary(label_bytes: bytes, count: float, total: float,
            quantiles: Sequence[tuple[float, float]]) -> bytes:
    body = _uint(1, int(count)) + _double(2, total) + b"".join(
        _bytes(3, _double(1, q) + _double(2, v)) for q, v in quantiles)
    return label_bytes + _bytes(4, body)


def histogram(label_bytes: bytes, count: float, total: float,
              buckets: Sequence[tuple[float, float]],
              native: Exponential | None = None) -> bytes:
    """A classic histogram's finite (upper bound, cumulative count) buckets, and the
    native one's sparse buckets beside them when kept. Prometheus 2.42 ingests the
    native part alone from such a message once its feature is on."""
    body = _uint(1, int(count)) + _double(2, total) + b"".join(
        _bucket(int(cumulative), bound) for bound, cumulative in buckets if math.isfinite(bound))
    if native is not None:
        spans, deltas = spans_and_deltas(native.counts)
        body += (_sint(5, native.schema) + _double(6, ZERO_THRESHOLD)
                 + _uint(7, native.zero)
                 + b"".join(_bytes(12, _sint(1, offset) + _uint(2, length))
                            for offset, length in spans)
                 + b"".join(_sint(13, delta) for delta in deltas))
    return label_bytes + _bytes(7, body)


def _bucket(cumulative: int, bound: float) -> bytes:
    """Histogram.bucket (field 3): Bucket{cumulative_count 1, upper_bound 2}."""
    inner = b"\x08" + _varint(cumulative) + _bound(bound)
    return b"\x1a" + _SMALL[len(inner)] + inner


@lru_cache(maxsize=4096)
def _bound(bound: float) -> bytes:
    return _double(2, bound)


def family(name: str, help_text: str, kind: int, metrics: Iterable[bytes]) -> bytes:
    """One length-delimited MetricFamily: the unit of the delimited stream."""
    body = (_text(1, name) + _text(2, help_text) + _uint(3, kind)
            + b"".join(_bytes(4, metric) for metric in metrics))
    return _varint(len(body)) + body


def from_client(metric) -> bytes:
    """A prometheus_client `Metric` (what a collector's `collect()` yields) as one
    delimited family, or two for a counter (Prometheus names the series `x_total`)."""
    kind = metric.type
    if kind in ("counter", "gauge", "info", "stateset", "unknown"):
        suffix = {"counter": "_total", "info": "_info"}.get(kind, "")
        name = metric.name + suffix
        make = {"counter": counter, "unknown": untyped}.get(kind, gauge)
        rows = [make(labels(s.labels.items()), s.value)
                for s in metric.samples if s.name == name]
        code = {"counter": COUNTER, "unknown": UNTYPED}.get(kind, GAUGE)
        return family(name, metric.documentation, code, rows)
    groups: dict[tuple, dict] = {}
    for s in metric.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("le", "quantile")))
        part = groups.setdefault(key, {"count": 0.0, "sum": 0.0, "points": []})
        tail = s.name[len(metric.name):]
        if tail in ("_count", "_gcount"):
            part["count"] = s.value
        elif tail in ("_sum", "_gsum"):
            part["sum"] = s.value
        elif tail == "_bucket":
            part["points"].append((float(s.labels["le"]), s.value))
        elif tail == "" and "quantile" in s.labels:
            part["points"].append((float(s.labels["quantile"]), s.value))
    if kind == "summary":
        rows = [summary(labels(k), p["count"], p["sum"], p["points"]) for k, p in groups.items()]
    else:
        rows = [histogram(labels(k), p["count"], p["sum"], p["points"]) for k, p in groups.items()]
    return family(metric.name, metric.documentation, _TYPES.get(kind, UNTYPED), rows)
