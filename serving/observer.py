"""Where a request's observation begins and ends: one `RequestRecord` in, spans,
metrics, an SLO verdict and a trace-log row out. Every request passes `finish()`
exactly once, rejected and failed ones too."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from observe.metrics import RequestMetrics
from observe.stats import RequestRecord, WallClock
from observe.tracing import RequestSpans
from slo.targets import DEFAULT_TTFT_TARGET, ContextTarget

TTFT_SLO = "ttft"


class Observer:
    def __init__(self, tracelog, spans: RequestSpans, metrics: RequestMetrics,
                 clock: WallClock, ttft_target: ContextTarget = DEFAULT_TTFT_TARGET):
        self.tracelog = tracelog
        self.spans = spans
        self.metrics = metrics
        self.clock = clock
        self.ttft_target = ttft_target

    def begin(self, endpoint: str, headers: Mapping[str, str]):
        """A record and an open `llm.request` span, stamped now."""
        rec = RequestRecord(request_id=_request_id(headers), arrival=time.monotonic(),
                            endpoint=endpoint)
        return rec, self.spans.start(rec, headers)

    def finish(self, rec: RequestRecord, span) -> None:
        if rec.end is None:
            rec.end = time.monotonic()
        self._judge(rec)
        self.spans.finish(rec, span)
        self.metrics.record_request(rec)
        self.tracelog.add("requests", rec.row(self.clock))

    def _judge(self, rec: RequestRecord) -> None:
        """The TTFT verdict against the context-aware target; a failed request is a
        bad event, a rejected or abandoned one is no event."""
        rec.slo_ttft_target_s = self.ttft_target(rec.prompt_tokens)
        if rec.status == "ok" and rec.ttft_s is not None:
            rec.slo_ok = rec.ttft_s <= rec.slo_ttft_target_s
        elif rec.status == "error":
            rec.slo_ok = False
        else:
            return
        result = "good" if rec.slo_ok else "bad"
        self.metrics.slo_requests.add(1, {"slo": TTFT_SLO, "context_bucket": rec.context_bucket,
                                          "result": result})


def _request_id(headers: Mapping[str, str]) -> str:
    """The client's `X-Request-Id` when it sent a sane one, else a fresh id."""
    given = headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and given.isprintable():
        return given
    return uuid.uuid4().hex
