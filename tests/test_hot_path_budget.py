"""What the server does per request on its observation path, counted exactly: a
change that adds per-request work (another span object, another metric measurement,
another trace-log row) fails here, whatever the machine's speed. Timings stay in
`bench/serving/hot_path.py`.

The request is the benchmark's: a served 300-token prompt with 16 output tokens in 17
engine steps, through the objects `serving.runtime.Runtime` wires (observer, step
consumers, policy engine, predictor, quota), spans written as rows (the default)."""

from __future__ import annotations

from collections import Counter

import pytest
from opentelemetry.sdk.trace import SpanProcessor

from bench.serving import hot_path as H
from observe.metrics import native as NM
from observe import registry as R


class CountingProcessor(SpanProcessor):
    """An OpenTelemetry span processor that counts span objects made."""

    def __init__(self):
        self.started = 0

    def on_start(self, span, parent_context=None):
        self.started += 1


def count_measurements(metrics, monkeypatch) -> Counter:
    """Every record/add/set on the registry's instruments, by metric: native ones are
    slotted, so counted on their classes; the SDK's on each instrument."""
    counts: Counter = Counter()
    for kind, method in ((NM.Histogram, "record"), (NM.Counter, "add"), (NM.Gauge, "set")):
        def native(self, value, attributes=None, _original=getattr(kind, method)):
            counts[self.metric.prom_name] += 1
            return _original(self, value, attributes)

        monkeypatch.setattr(kind, method, native)
    for name, instrument in metrics.instruments.items():
        if isinstance(instrument, NM._Instrument):
            continue
        for method in ("record", "add", "set"):
            if hasattr(instrument, method):
                def sdk(value, attributes=None, _name=name,
                        _original=getattr(instrument, method)):
                    counts[_name] += 1
                    return _original(value, attributes)

                monkeypatch.setattr(instrument, method, sdk)
    return counts


@pytest.fixture(params=["rows", "otel"])
def wired(request, tmp_path, monkeypatch):
    """The server's objects, spans as rows and metrics native (the default) or both
    through the SDK (with an OTLP exporter): the same rows and measurements either way."""
    observer, consumers, tracelog, export, provider = H.build(tmp_path, request.param)
    rows: Counter = Counter()
    add = tracelog.add
    monkeypatch.setattr(tracelog, "add", lambda table, row: (rows.update([table]),
                                                              add(table, row)))
    measurements = count_measurements(observer.metrics, monkeypatch)
    spans = CountingProcessor()
    provider.add_span_processor(spans)
    yield request.param, observer, consumers, rows, measurements, spans
    tracelog.close()
    export.shutdown()


def test_one_request_costs_exactly_this_much_work(wired):
    side, observer, consumers, rows, measurements, spans = wired
    H.one_request(observer, consumers, H.Timer(), 0, 0)  # warms lazily built state
    rows.clear(), measurements.clear()
    spans.started = 0
    H.one_request(observer, consumers, H.Timer(), 1, 100)
    steps = H.OUTPUT_TOKENS + 1
    # one requests row; the request's span and its five phases; one row per step
    assert dict(rows) == {"requests": 1, "spans": 6 + steps}
    per_step = {R.BATCH_SIZE.prom_name: steps}
    per_request = {
        R.REQUESTS.prom_name: 1, R.CONTEXT_TOKENS.prom_name: 1,
        **{m.prom_name: 1 for m in R.LATENCY_METRICS},
        R.SLO_REQUESTS.prom_name: 6,  # one verdict per SLO of the default spec
        **{m.prom_name: 1 for trio in R.PREDICTION_METRICS.values() for m in trio},
        R.CLIENT_REQUESTS.prom_name: 1,
    }
    assert dict(measurements) == {**per_request, **per_step}
    assert sum(per_request.values()) == 22
    # an OpenTelemetry span object per row only where something besides the trace log
    # listens for spans; none by default
    assert spans.started == (0 if side == "rows" else 6 + steps)
