"""Two in-memory OTLP collectors for tests: OTLP/HTTP and OTLP/gRPC on loopback.

Each is a context manager that listens on a free port (or the one given), decodes
every export request it is sent, answers it as a collector would, and keeps the
decoded requests and the headers they came with. `spans()` and `metric_points()`
flatten them into plain records to assert on.
"""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"


@dataclass(frozen=True)
class SeenSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str | None
    kind: int  # SPAN_KIND_*: 1 internal, 2 server
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict


@dataclass(frozen=True)
class SeenPoint:
    metric: str
    unit: str
    attributes: dict
    value: float | None = None  # sum or gauge
    count: int | None = None  # histogram
    sum: float | None = None
    bucket_counts: tuple[int, ...] = ()
    monotonic: bool | None = None  # sums only
    resource: dict | None = None


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class _Recorder:
    """The decoded requests and their headers (lower-case names), thread-safe."""

    def __init__(self):
        self.traces: list[tpb.ExportTraceServiceRequest] = []
        self.metrics: list[mpb.ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def _record(self, request, headers: dict[str, str]) -> None:
        with self._lock:
            kept = self.traces if isinstance(request, tpb.ExportTraceServiceRequest) else self.metrics
            kept.append(request)
            self.headers.append(headers)

    def spans(self) -> list[SeenSpan]:
        with self._lock:
            requests = list(self.traces)
        return [SeenSpan(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex() or None,
                         s.kind, s.start_time_unix_nano, s.end_time_unix_nano,
                         _attributes(s.attributes), _attributes(rs.resource.attributes))
                for r in requests for rs in r.resource_spans for ss in rs.scope_spans
                for s in ss.spans]

    def span_names(self) -> list[str]:
        return sorted(s.name for s in self.spans())

    def metric_points(self) -> list[SeenPoint]:
        with self._lock:
            requests = list(self.metrics)
        return [point for r in requests for rm in r.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics for point in _points(m, _attributes(rm.resource.attributes))]

    def metric_names(self) -> set[str]:
        return {p.metric for p in self.metric_points()}

    def last_points(self, metric: str) -> list[SeenPoint]:
        """The points of `metric` in the latest export that carried it (cumulative)."""
        points = [p for p in self.metric_points() if p.metric == metric]
        by_labels = {tuple(sorted(p.attributes.items())): p for p in points}
        return list(by_labels.values())


def _points(metric, resource: dict):
    kind = metric.WhichOneof("data")
    data = getattr(metric, kind)
    for p in data.data_points:
        attrs = _attributes(p.attributes)
        if kind == "histogram":
            yield SeenPoint(metric.name, metric.unit, attrs, count=p.count, sum=p.sum,
                            bucket_counts=tuple(p.bucket_counts), resource=resource)
        else:
            value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
            monotonic = data.is_monotonic if kind == "sum" else None
            yield SeenPoint(metric.name, metric.unit, attrs, value=value, monotonic=monotonic,
                            resource=resource)


# --- OTLP/HTTP --------------------------------------------------------------------------
_HTTP_ROUTES = {
    TRACES_PATH: (tpb.ExportTraceServiceRequest, tpb.ExportTraceServiceResponse),
    METRICS_PATH: (mpb.ExportMetricsServiceRequest, mpb.ExportMetricsServiceResponse),
}


class _Handler(BaseHTTPRequestHandler):
    recorder: _Recorder  # set per receiver

    def do_POST(self):  # noqa: N802 (the stdlib's name)
        route = _HTTP_ROUTES.get(self.path)
        if route is None or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(404 if route is None else 415)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request_cls, response_cls = route
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.recorder._record(request_cls.FromString(body), headers)
        payload = response_cls().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class HttpReceiver(_Recorder):
    """An OTLP/HTTP collector: POST /v1/traces and /v1/metrics, protobuf (gzip optional)."""

    def __init__(self, port: int = 0):
        super().__init__()
        self._port = port

    def __enter__(self) -> "HttpReceiver":
        handler = type("Handler", (_Handler,), {"recorder": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


# --- OTLP/gRPC --------------------------------------------------------------------------
class _TraceService(tgrpc.TraceServiceServicer):
    def __init__(self, recorder: _Recorder):
        self._recorder = recorder

    def Export(self, request, context):  # noqa: N802 (the service's name)
        self._recorder._record(request, dict(context.invocation_metadata()))
        return tpb.ExportTraceServiceResponse()


class _MetricsService(mgrpc.MetricsServiceServicer):
    def __init__(self, recorder: _Recorder):
        self._recorder = recorder

    def Export(self, request, context):  # noqa: N802
        self._recorder._record(request, dict(context.invocation_metadata()))
        return mpb.ExportMetricsServiceResponse()


class GrpcReceiver(_Recorder):
    """An OTLP/gRPC collector: TraceService and MetricsService, plaintext."""

    def __init__(self, port: int = 0):
        super().__init__()
        self._port = port

    def __enter__(self) -> "GrpcReceiver":
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        tgrpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        mgrpc.add_MetricsServiceServicer_to_server(_MetricsService(self), self._server)
        port = self._server.add_insecure_port(f"127.0.0.1:{self._port}")
        self._server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(grace=None).wait()
