"""Instruments for every metric in the registry, exported to Prometheus: kept natively
(`observe.metrics.native`) when Prometheus is the only reader, OpenTelemetry's when an
OTLP exporter reads them too; `/metrics` reads the same either way.

`create_instruments(meter)` builds them from `observe.registry`; `RequestMetrics`
turns a finished `RequestRecord` or an `EngineSnapshot` into bare `.record()`,
`.add()` and `.set()` calls. Label sets are tiny dicts built once per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from observe import registry as R
from observe.metrics.native import NativeCollector, NativeMeter
from observe.metrics.protobuf import CONTENT_TYPE as PROTOBUF_TYPE
from observe.metrics.protobuf import wants_protobuf
from observe.record import RequestRecord
from observe.stats import EngineSnapshot


def create_instrument(meter, metric: R.MetricDef, buckets: tuple[float, ...] | None = None,
                      exponential: bool = False):
    """`buckets`: a histogram's bounds in place of the registry's (`--histogram-buckets`);
    `exponential`: it keeps native buckets too (`--native-histograms`, native meter only)."""
    if buckets is not None:
        metric = replace(metric, buckets=tuple(buckets))
    if isinstance(meter, NativeMeter):
        return meter.instrument(metric, exponential)
    if exponential:
        raise ValueError("native histograms need the native meter (no OTLP metric export)")
    kwargs = {"unit": metric.unit, "description": metric.description}
    if metric.kind == "histogram":
        return meter.create_histogram(
            metric.otel_name, explicit_bucket_boundaries_advisory=list(metric.buckets), **kwargs)
    if metric.kind == "counter":
        return meter.create_counter(metric.otel_name, **kwargs)
    return meter.create_gauge(metric.otel_name, **kwargs)


def create_instruments(meter, buckets: Mapping[str, tuple[float, ...]] | None = None,
                       exponential: bool = False) -> dict[str, object]:
    """All registry instruments, keyed by Prometheus name; `buckets` replaces the bounds
    of the histograms it names; `exponential`: the latency histograms keep native
    buckets too (the token and batch-size ones stay classic: CONTRACT names bounds)."""
    buckets = buckets or {}
    latency = {m.prom_name for m in R.LATENCY_METRICS} if exponential else set()
    return {m.prom_name: create_instrument(meter, m, buckets.get(m.prom_name),
                                           m.prom_name in latency)
            for m in R.ALL_METRICS}


@dataclass(slots=True)
class MetricsExport:
    """A meter provider whose reader feeds a prometheus_client registry (for the native
    kind, one object is both)."""

    provider: object
    reader: object
    registry: object

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """What /metrics serves, with its content type: the registry's Prometheus text
        (the native collector writes its own families, faster than prometheus_client
        would), or the protobuf format where the scrape's `accept` header asks for it
        first and native buckets are kept (`observe.metrics.protobuf`)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if not isinstance(self.reader, NativeCollector):
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        if self.reader.exponential and wants_protobuf(accept):
            return self.reader.exposition(self.registry, protobuf=True), PROTOBUF_TYPE
        return self.reader.exposition(self.registry), CONTENT_TYPE_LATEST

    def shutdown(self) -> None:
        """Stops the provider; its reader leaves the registry."""
        self.provider.shutdown()
        if isinstance(self.reader, NativeCollector):  # the SDK's reader leaves by itself
            self.registry.unregister(self.reader)


def create_prometheus_export(registry=None, extra_readers=(), resource=None,
                             native: bool | None = None) -> MetricsExport:
    """Instruments served on `registry` (prometheus_client's default one unless given,
    so vLLM's own `vllm:*` series are served beside ours on /metrics).

    Kept natively (`observe.metrics.native`, a tenth of the SDK's cost per
    measurement) when Prometheus is the only reader; through an OpenTelemetry meter
    provider when other readers (OTLP export) need the same instruments, `resource`
    naming the service for those. `native` forces one or the other."""
    from prometheus_client import REGISTRY

    registry = registry or REGISTRY
    if native is None:
        native = not extra_readers
    if native:
        collector = NativeCollector()
        registry.register(collector)
        return MetricsExport(collector, collector, registry)
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider

    reader = PrometheusMetricReader(disable_target_info=True, registry=registry)
    kwargs = {"resource": resource} if resource is not None else {}
    provider = MeterProvider(metric_readers=[reader, *extra_readers], **kwargs)
    return MetricsExport(provider, reader, registry)


class RequestMetrics:
    """Records requests and engine seconds into the registry's instruments."""

    def __init__(self, meter, buckets: Mapping[str, tuple[float, ...]] | None = None,
                 exponential: bool = False):
        self.instruments = create_instruments(meter, buckets, exponential)
        i = self.instruments
        self._latency = [(i[m.prom_name], m) for m in R.LATENCY_METRICS]
        self._context = i[R.CONTEXT_TOKENS.prom_name]
        self._requests = i[R.REQUESTS.prom_name]
        self._errors = i[R.ERRORS.prom_name]
        self._batch = i[R.BATCH_SIZE.prom_name]
        self._kv = i[R.KV_CACHE_USAGE.prom_name]
        self._running = i[R.RUNNING.prom_name]
        self._waiting = i[R.WAITING.prom_name]
        self._dropped = i[R.TRACE_ROWS_DROPPED.prom_name]
        self._forecast = i[R.MEMORY_FORECAST.prom_name]
        self._exhaustion = i[R.KV_CACHE_EXHAUSTION.prom_name]
        self._policy = i[R.POLICY_ACTIVE.prom_name]
        self._clients = i[R.CLIENT_REQUESTS.prom_name]
        self._loop_lag = i[R.EVENT_LOOP_LAG.prom_name]
        self._length_bound = i[R.LENGTH_CLASS_BOUND.prom_name]
        self.slo_requests = i[R.SLO_REQUESTS.prom_name]
        self._prediction = {target: tuple(i[m.prom_name] for m in trio)
                            for target, trio in R.PREDICTION_METRICS.items()}

    def record_request(self, rec: RequestRecord) -> None:
        bucket = rec.context_bucket
        self._requests.add(1, {R.LABEL_STATUS: rec.status, R.LABEL_CONTEXT_BUCKET: bucket,
                               R.LABEL_PRIORITY: rec.priority})
        if rec.error_type:
            self._errors.add(1, {R.LABEL_ERROR_TYPE: rec.error_type,
                                 R.LABEL_HTTP_STATUS: str(rec.http_status)})
        if rec.status != R.STATUS_OK:
            return  # latency of a failed request would pollute the SLO histograms
        labels = {R.LABEL_CONTEXT_BUCKET: bucket}
        self._context.record(rec.prompt_tokens)
        for instrument, value in zip(self._latency_instruments(), _latencies(rec)):
            if value is not None:
                instrument.record(value, labels)

    def _latency_instruments(self):
        return (instrument for instrument, _ in self._latency)

    def record_prediction(self, target: str, bucket: str, error: float | None,
                          within_p90: bool | None) -> None:
        """One judged prediction of `target` (`ttft_s`, `tpot_s`): its p50's relative
        error, and whether the actual was at or under its p90 (None: not judged)."""
        errors, judged, within = self._prediction[target]
        labels = {R.LABEL_CONTEXT_BUCKET: bucket}
        if error is not None:
            errors.record(error, labels)
        if within_p90 is not None:
            judged.add(1, labels)
            within.add(1 if within_p90 else 0, labels)  # 0 too: coverage 0 is a value

    def record_client(self, client: str, outcome: str) -> None:
        """One finished request of `client` (a bounded label value) with its outcome."""
        self._clients.add(1, {R.LABEL_CLIENT: client, R.LABEL_OUTCOME: outcome})

    def record_loop_lag(self, seconds: float) -> None:
        self._loop_lag.record(seconds)

    def record_step(self, batch_size: int) -> None:
        self._batch.record(batch_size)

    def record_engine(self, snap: EngineSnapshot) -> None:
        self._kv.set(snap.kv_cache_usage)
        self._running.set(snap.running)
        self._waiting.set(snap.waiting)

    def record_policy(self, policy: str, active: int) -> None:
        self._policy.set(active, {R.LABEL_POLICY: policy})

    def record_forecast(self, ratio: float, horizon: str) -> None:
        self._forecast.set(ratio, {R.LABEL_HORIZON: horizon})

    def record_kv_exhaustion(self, seconds: float | None) -> None:
        """None (not rising) and anything an hour or more away read as the cap."""
        cap = R.KV_EXHAUSTION_CAP_S
        self._exhaustion.set(cap if seconds is None else min(seconds, cap))

    def record_length_bounds(self, low: int, high: int) -> None:
        """Seed 000's length-class boundaries in force (`slo.policy.length_classes`)."""
        self._length_bound.set(low, {R.LABEL_BOUND: "low"})
        self._length_bound.set(high, {R.LABEL_BOUND: "high"})

    def record_dropped(self, table: str, rows: int) -> None:
        if rows:
            self._dropped.add(rows, {R.LABEL_TABLE: table})


def _latencies(rec: RequestRecord) -> tuple:
    """Values in the order of `registry.LATENCY_METRICS`."""
    engine = rec.engine
    sampling = rec.tally.sampling_s if rec.tally.steps else None
    return (rec.ttft_s, rec.tpot_s, rec.e2e_s,
            engine and engine.queue_s, engine and engine.prefill_s,
            engine and engine.decode_s, sampling)
