"""Where a request's observation begins and ends: one `RequestRecord` in, spans,
metrics, an SLO verdict and a trace-log row out. Every request passes `finish()`
exactly once, rejected and failed ones too."""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping

from observe import registry as R
from observe.metrics import RequestMetrics
from observe.record import RequestRecord
from observe.stats import WallClock
from observe.tracing import RequestSpans
from serving.keys import ANONYMOUS
from slo.loading import load_spec
from slo.predict.accuracy import judge_served
from slo.spec import SLOSpec
from slo.tenants import outcome, tenant_label
from slo.verdicts import Judge


class Observer:
    def __init__(self, tracelog, spans: RequestSpans, metrics: RequestMetrics,
                 clock: WallClock, spec: SLOSpec | None = None,
                 clients: Collection[str] = (ANONYMOUS.name,)):
        self.tracelog = tracelog
        self.spans = spans
        self.metrics = metrics
        self.clock = clock
        self.judge = Judge(spec or load_spec())
        self.clients = frozenset(clients)  # the `client` label's values (the keys file's)
        self.listeners: list = []  # called with each finished record (the policy engine)
        self._open: set[str] = set()  # request ids begun and not yet finished
        self._count_verdicts_from_zero()

    def _count_verdicts_from_zero(self) -> None:
        """Every SLO x context bucket x result series exists at 0 from the first scrape
        (Prometheus' instrumentation guide): a series born at its first bad event has no
        earlier sample, so `rate()` would never see that increment, and after every
        restart the first failure of each SLO and bucket would miss the burn rates."""
        for slo in self.judge.spec.slos:
            for bucket in R.CONTEXT_BUCKETS:
                for result in R.RESULTS:
                    self.metrics.slo_requests.add(0, {R.LABEL_SLO: slo.name,
                                                      R.LABEL_CONTEXT_BUCKET: bucket,
                                                      R.LABEL_RESULT: result})

    @property
    def in_flight(self) -> int:
        """Requests begun and not yet finished (`GET /load`)."""
        return len(self._open)

    def begin(self, endpoint: str, headers: Mapping[str, str]):
        """A record and an open `llm.request` span, stamped now."""
        request_id = _request_id(headers)
        if request_id in self._open:  # the engine and step ledger key on it: keep it unique
            request_id = f"{request_id}-{uuid.uuid4().hex[:8]}"
        self._open.add(request_id)
        rec = RequestRecord(request_id=request_id, arrival=time.monotonic(),
                            endpoint=endpoint)
        return rec, self.spans.start(rec, headers)

    def finish(self, rec: RequestRecord, span) -> None:
        self._open.discard(rec.request_id)
        if rec.end is None:
            rec.end = time.monotonic()
        self._judge(rec)
        self._judge_prediction(rec)
        self.spans.finish(rec, span)
        self.metrics.record_request(rec)
        self.metrics.record_client(tenant_label(rec.client, self.clients), outcome(rec))
        self.tracelog.add("requests", rec.row(self.clock))
        for listener in self.listeners:
            listener(rec)

    def _judge(self, rec: RequestRecord) -> None:
        """Each SLO's verdict, counted per context bucket: what makes context-aware
        SLOs expressible in PromQL."""
        bucket = rec.context_bucket
        for name, good in self.judge.judge(rec):
            result = R.RESULT_GOOD if good else R.RESULT_BAD
            self.metrics.slo_requests.add(1, {R.LABEL_SLO: name, R.LABEL_CONTEXT_BUCKET: bucket,
                                              R.LABEL_RESULT: result})

    def _judge_prediction(self, rec: RequestRecord) -> None:
        """The latency predictor watched live: its error and p90 coverage per context
        bucket, by the accuracy rule the CLI and the console use."""
        for judged in judge_served(rec):
            self.metrics.record_prediction(judged.target, rec.context_bucket, judged.error,
                                           judged.within_p90)


def _request_id(headers: Mapping[str, str]) -> str:
    """The client's `X-Request-Id` when it sent a sane one, else a fresh id. One that a
    request in flight already carries gets a suffix (`begin`); the answer's
    `X-Request-Id` names the row either way."""
    given = headers.get("x-request-id", "")
    if 0 < len(given) <= 128 and given.isprintable():
        return given
    return uuid.uuid4().hex
