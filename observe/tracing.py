"""OpenTelemetry spans for requests and engine steps, with the trace log as an exporter.

Phase spans are made after the fact with the engine's own timestamps, so they cost
nothing while the request runs and their times are the engine's, not ours. The
`llm.sampling` span is an aggregate: the sampler runs once per engine step, so the
span starts at the request's first sampling and lasts the *sum* of its sampling
times (attribute `tailguard.sampling.steps` says over how many steps).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from functools import lru_cache

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from observe import registry as R
from observe.record import RequestRecord
from observe.stats import StepRecord, WallClock

_PROPAGATOR = TraceContextTextMapPropagator()


@lru_cache(maxsize=16384)
def span_hex(span_id: int) -> str:
    """A request span is linked from every step of its batch: format its id once."""
    return format(span_id, "016x")


def ts(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)


def span_row(span: ReadableSpan) -> dict:
    """A `spans` table row (CONTRACT.md) for a finished span."""
    ctx, parent = span.context, span.parent
    attributes = dict(span.attributes or {})
    if span.links:
        attributes["links"] = [span_hex(link.context.span_id) for link in span.links]
    return {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(parent.span_id, "016x") if parent else None,
        "request_id": attributes.get(R.ATTR_REQUEST_ID),
        "name": span.name,
        "start_ts": ts(span.start_time),
        "end_ts": ts(span.end_time),
        "duration_s": (span.end_time - span.start_time) / 1e9,
        "attributes": attributes,  # JSON-encoded by the trace log's flush thread, off this one
    }


class RowSpanProcessor(SpanProcessor):
    """Hands each finished span to `sink` as a trace-log row (cheap, non-blocking)."""

    def __init__(self, sink: Callable[[dict], None]):
        self._sink = sink

    def on_end(self, span: ReadableSpan) -> None:
        self._sink(span_row(span))


def create_tracer_provider(sink: Callable[[dict], None] | None = None,
                           service_name: str = "tailguard") -> TracerProvider:
    from opentelemetry.sdk.resources import Resource

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if sink is not None:
        provider.add_span_processor(RowSpanProcessor(sink))
    return provider


class RequestSpans:
    """Creates the `llm.request` tree and `llm.step` spans linked to it."""

    def __init__(self, provider: TracerProvider, clock: WallClock, recent: int = 4096):
        self._tracer = provider.get_tracer("tailguard")
        self._clock = clock
        self._contexts: OrderedDict[str, trace.SpanContext] = OrderedDict()
        self._recent = recent

    def start(self, rec: RequestRecord, headers: Mapping[str, str]):
        """Open `llm.request` at the arrival time, as a child of the caller's
        W3C `traceparent` when one came with the request."""
        parent = _PROPAGATOR.extract(carrier=headers)
        span = self._tracer.start_span(
            R.SPAN_REQUEST, context=parent, kind=SpanKind.SERVER,
            start_time=self._clock.epoch_ns(rec.arrival),
            attributes={R.ATTR_REQUEST_ID: rec.request_id, R.ATTR_PROVIDER: "vllm",
                        R.ATTR_OPERATION: R.OPERATIONS.get(rec.endpoint, rec.endpoint)})
        ctx = span.get_span_context()
        rec.trace_id = format(ctx.trace_id, "032x")
        self._remember(rec.request_id, ctx)
        return span

    def _remember(self, request_id: str, ctx) -> None:
        self._contexts[request_id] = ctx
        while len(self._contexts) > self._recent:
            self._contexts.popitem(last=False)

    def finish(self, rec: RequestRecord, span) -> None:
        """Add the phase children and close the request span at `rec.end`."""
        parent = trace.set_span_in_context(span)
        for name, start, end, attrs in phases(rec):
            child = self._tracer.start_span(
                name, context=parent, start_time=self._clock.epoch_ns(start),
                attributes={R.ATTR_REQUEST_ID: rec.request_id, **attrs})
            child.end(end_time=self._clock.epoch_ns(end))
        span.set_attributes(request_attributes(rec))
        if rec.status == R.STATUS_ERROR:
            span.set_status(Status(StatusCode.ERROR, rec.error_message or rec.error_type))
        span.end(end_time=self._clock.epoch_ns(rec.end))

    def step(self, step: StepRecord, warmup: bool = False) -> None:
        """One `llm.step` span, linked to the request spans of its batch (`warmup`: a
        step of the engine's warm-up, marked as such)."""
        links = [Link(ctx) for rid in step.request_ids
                 if (ctx := self._contexts.get(rid)) is not None]
        span = self._tracer.start_span(
            R.SPAN_STEP, links=links, start_time=self._clock.epoch_ns(step.start),
            attributes={R.ATTR_STEP_INDEX: step.index, R.ATTR_STEP_BATCH: len(step.request_ids),
                        R.ATTR_STEP_TOKENS: step.scheduled_tokens,
                        R.ATTR_STEP_PAIRS: step.attention_pairs,
                        R.ATTR_STEP_FORWARD_S: step.forward_s,
                        R.ATTR_STEP_SAMPLING_S: step.sampling_s,
                        **({R.ATTR_STEP_WARMUP: True} if warmup else {})})
        span.end(end_time=self._clock.epoch_ns(step.start + step.duration_s))


def phases(rec: RequestRecord):
    engine, tally = rec.engine, rec.tally
    if engine is None:
        return
    if engine.accepted is not None:
        yield R.SPAN_TOKENIZE, rec.arrival, max(rec.arrival, engine.accepted), {}
    yield R.SPAN_QUEUE, engine.queue_start, engine.scheduled, {}
    yield R.SPAN_PREFILL, engine.scheduled, engine.first_token, {}
    yield R.SPAN_DECODE, engine.first_token, engine.last_token, {}
    if tally.steps:
        start = tally.first_sampling_start
        yield (R.SPAN_SAMPLING, start, start + tally.sampling_s,
               {R.ATTR_SAMPLING_STEPS: tally.steps})


def request_attributes(rec: RequestRecord) -> dict:
    attrs = {
        R.ATTR_REQUEST_MODEL: rec.model, R.ATTR_STREAM: rec.stream,
        R.ATTR_INPUT_TOKENS: rec.prompt_tokens, R.ATTR_OUTPUT_TOKENS: rec.output_tokens,
        R.ATTR_CONTEXT_BUCKET: rec.context_bucket, R.ATTR_BATCH_BUCKET: rec.batch_bucket,
        R.ATTR_PRIORITY: rec.priority, R.ATTR_STATUS: rec.status,
        R.ATTR_HTTP_STATUS: rec.http_status, R.ATTR_ITERATIONS: rec.tally.steps,
        R.ATTR_POLICY_ACTIONS: list(rec.policy_actions),
    }
    optional = {R.ATTR_MAX_TOKENS: rec.max_tokens, R.ATTR_ERROR_TYPE: rec.error_type,
                R.ATTR_TTFT: rec.ttft_s, R.ATTR_RESPONSE_ID: rec.request_id,
                R.ATTR_CLIENT: rec.client}
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if rec.finish_reason:
        attrs[R.ATTR_FINISH_REASONS] = [rec.finish_reason]
    if rec.engine:
        attrs[R.ATTR_PREEMPTIONS] = rec.engine.preemptions
    return attrs
