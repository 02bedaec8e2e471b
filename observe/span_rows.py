"""The `spans` rows of a request and of each engine step, written straight to the trace
log: what `observe.tracing.RequestSpans` writes through OpenTelemetry, row for row,
without an OpenTelemetry span object per span.

An SDK span costs about 20 µs to make and end here, and a request makes six of them
(its own and five phases) plus its share of one `llm.step` span per engine step
linked to every request of the batch: more CPU than the rest of the request's
observation together (`bench/serving/hot_path.py`). When nothing but the trace log
listens for spans (no OTLP exporter, no profiler linking spans to profiles), the
server writes the rows itself (`serving/runtime.py` chooses); the ids, times,
attributes and sampling decision are those the SDK would have made, which
`tests/test_span_rows.py` checks against `RequestSpans` for the same records.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from observe import registry as R
from observe.record import RequestRecord
from observe.stats import StepRecord, WallClock
from observe.tracing import phases, request_attributes, span_hex, ts

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACEPARENT = "traceparent"


class OpenRequest:
    """A request's span between `start` and `finish`: its ids and its start."""

    __slots__ = ("trace_id", "span_id", "parent_span_id", "start_ns", "sampled")

    def __init__(self, trace_id: str, span_id: int, parent_span_id: str | None,
                 start_ns: int, sampled: bool):
        self.trace_id, self.span_id, self.parent_span_id = trace_id, span_id, parent_span_id
        self.start_ns, self.sampled = start_ns, sampled


def _new_id(bits: int) -> int:
    """As the SDK's RandomIdGenerator: random, never the invalid 0."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


def _parent(headers: Mapping[str, str]):
    """The caller's valid W3C `traceparent` span context, else None (the SDK's rule)."""
    if not headers.get(_TRACEPARENT):
        return None
    ctx = trace.get_current_span(_PROPAGATOR.extract(carrier=headers)).get_span_context()
    return ctx if ctx.is_valid else None


class RowSpans:
    """`RequestSpans`' interface (`start`, `finish`, `step`), rows to `sink`."""

    def __init__(self, sink: Callable[[dict], None], clock: WallClock, recent: int = 4096):
        self._sink = sink
        self._clock = clock
        self._span_ids: OrderedDict[str, int] = OrderedDict()
        self._recent = recent

    def start(self, rec: RequestRecord, headers: Mapping[str, str]) -> OpenRequest:
        """Ids for `llm.request`, as a child of the caller's `traceparent` when one came
        with the request (a parent not sampled: the request is not either, as the
        SDK's default parent-based sampler decides)."""
        parent = _parent(headers)
        if parent is None:
            trace_id, parent_id, sampled = _new_id(128), None, True
        else:
            trace_id, parent_id = parent.trace_id, format(parent.span_id, "016x")
            sampled = parent.trace_flags.sampled
        span_id = _new_id(64)
        rec.trace_id = format(trace_id, "032x")
        self._span_ids[rec.request_id] = span_id
        while len(self._span_ids) > self._recent:
            self._span_ids.popitem(last=False)
        return OpenRequest(rec.trace_id, span_id, parent_id,
                           self._clock.epoch_ns(rec.arrival), sampled)

    def finish(self, rec: RequestRecord, span: OpenRequest) -> None:
        """The phase rows, then the request's own row ending at `rec.end`."""
        if not span.sampled:
            return
        own = span_hex(span.span_id)
        epoch_ns = self._clock.epoch_ns
        for name, start, end, attrs in phases(rec):
            self._row(span.trace_id, _new_id(64), own, rec.request_id, name,
                      epoch_ns(start), epoch_ns(end), {R.ATTR_REQUEST_ID: rec.request_id,
                                                       **attrs})
        attributes = {R.ATTR_REQUEST_ID: rec.request_id, R.ATTR_PROVIDER: "vllm",
                      R.ATTR_OPERATION: R.OPERATIONS.get(rec.endpoint, rec.endpoint)}
        # the SDK drops a None attribute value (it is not a valid one)
        attributes.update((k, v) for k, v in request_attributes(rec).items() if v is not None)
        self._row(span.trace_id, span.span_id, span.parent_span_id, rec.request_id,
                  R.SPAN_REQUEST, span.start_ns, epoch_ns(rec.end), attributes)

    def step(self, step: StepRecord, warmup: bool = False) -> None:
        """One `llm.step` row (a trace of its own), linked to its batch's requests;
        `warmup`: a step of the engine's warm-up, marked as such."""
        epoch_ns = self._clock.epoch_ns
        attributes = {R.ATTR_STEP_INDEX: step.index, R.ATTR_STEP_BATCH: len(step.request_ids),
                      R.ATTR_STEP_TOKENS: step.scheduled_tokens,
                      R.ATTR_STEP_PAIRS: step.attention_pairs,
                      R.ATTR_STEP_FORWARD_S: step.forward_s,
                      R.ATTR_STEP_SAMPLING_S: step.sampling_s}
        known = self._span_ids
        links = [span_hex(span_id) for rid in step.request_ids
                 if (span_id := known.get(rid)) is not None]
        if links:
            attributes["links"] = links
        if warmup:
            attributes[R.ATTR_STEP_WARMUP] = True
        self._row(format(_new_id(128), "032x"), _new_id(64), None, None, R.SPAN_STEP,
                  epoch_ns(step.start), epoch_ns(step.start + step.duration_s), attributes)

    def _row(self, trace_id: str, span_id: int, parent: str | None, request_id: str | None,
             name: str, start_ns: int, end_ns: int, attributes: dict) -> None:
        self._sink({"trace_id": trace_id, "span_id": format(span_id, "016x"),
                    "parent_span_id": parent, "request_id": request_id, "name": name,
                    "start_ts": ts(start_ns), "end_ts": ts(end_ns),
                    "duration_s": (end_ns - start_ns) / 1e9, "attributes": attributes})
