"""`RowSpans` writes the rows `RequestSpans` writes through OpenTelemetry, for the same
records: names, parents, times, durations and attributes equal; ids fresh but shaped
and linked the same; a caller's traceparent honoured the same way, sampled or not."""

from __future__ import annotations

import json

import pytest

from observe import registry as R
from observe.record import RequestRecord
from observe.span_rows import RowSpans
from observe.stats import EngineTimes, StepRecord, WallClock
from observe.tracing import RequestSpans, create_tracer_provider

CLOCK = WallClock(offset=1_741_064_000.0)
TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


def served(request_id: str, status: str = R.STATUS_OK) -> RequestRecord:
    rec = RequestRecord(request_id=request_id, arrival=100.0, endpoint="/v1/chat/completions",
                        model="tiny", stream=True, prompt_tokens=300, output_tokens=3,
                        max_tokens=8, finish_reason="length", client="alice", status=status,
                        http_status=200 if status == R.STATUS_OK else 503)
    if status != R.STATUS_OK:
        rec.error_type, rec.error_message = "engine_dead", "the engine died"
    rec.engine = EngineTimes(queued=100.01, scheduled=100.02, first_token=100.05,
                             last_token=100.09, preemptions=1, accepted=100.005)
    rec.policy_actions.append("cap_max_tokens:256")
    for k in range(3):
        rec.tally.add(100.02 + 0.03 * k, 0.02, 0.0025)
    rec.end = 100.1
    return rec


def rows_of(make_spans, headers: dict, status: str = R.STATUS_OK) -> list[dict]:
    rows: list[dict] = []
    spans = make_spans(rows.append)
    rec = served("req-1", status)
    span = spans.start(rec, headers)
    spans.step(StepRecord(7, 100.02, 0.017, 0.003, 316, ("req-1", "someone-else")))
    spans.finish(rec, span)
    request = [r for r in rows if r["name"] == R.SPAN_REQUEST]
    assert [rec.trace_id] == [r["trace_id"] for r in request]
    return rows


def otel(sink):
    return RequestSpans(create_tracer_provider(sink), CLOCK)


def direct(sink):
    return RowSpans(sink, CLOCK)


def comparable(rows: list[dict]) -> list[dict]:
    """Ids replaced by their role: which row's span they name."""
    names = {row["span_id"]: row["name"] for row in rows}
    out = []
    for row in rows:
        attributes = json.loads(json.dumps(row["attributes"]))  # as the trace log stores it
        if "links" in attributes:
            attributes["links"] = [names.get(link, "?") for link in attributes["links"]]
        out.append({**row, "attributes": attributes, "span_id": len(row["span_id"]),
                    "trace_id": len(row["trace_id"]),
                    "parent_span_id": names.get(row["parent_span_id"], row["parent_span_id"])})
    return sorted(out, key=lambda r: r["name"])


@pytest.mark.parametrize("headers", [
    {},
    {"traceparent": f"00-{TRACE}-{PARENT}-01"},  # a sampled caller: its child
    {"traceparent": "00-zz-nonsense-01"},  # invalid: a root of its own
])
@pytest.mark.parametrize("status", [R.STATUS_OK, R.STATUS_ERROR])
def test_the_same_rows_with_or_without_opentelemetry(headers, status):
    ours, sdk = rows_of(direct, headers, status), rows_of(otel, headers, status)
    assert [r["name"] for r in ours] == [r["name"] for r in sdk]  # same order too
    assert comparable(ours) == comparable(sdk)
    by_name = {r["name"]: r for r in ours}
    request = by_name[R.SPAN_REQUEST]
    expected_parent = PARENT if headers.get("traceparent", "").startswith("00-0af") else None
    assert request["parent_span_id"] == expected_parent
    assert by_name[R.SPAN_STEP]["attributes"]["links"] == [request["span_id"]]
    assert {r["trace_id"] for r in ours if r["name"] != R.SPAN_STEP} == {request["trace_id"]}


def test_a_caller_that_does_not_sample_gets_no_rows_either_way():
    headers = {"traceparent": f"00-{TRACE}-{PARENT}-00"}
    for make in (direct, otel):
        rows: list[dict] = []
        spans = make(rows.append)
        rec = served("req-2")
        spans.finish(rec, spans.start(rec, headers))
        assert rows == [] and rec.trace_id == TRACE


def test_exact_row_values():
    rows = rows_of(direct, {"traceparent": f"00-{TRACE}-{PARENT}-01"})
    by_name = {r["name"]: r for r in rows}
    queue = by_name[R.SPAN_QUEUE]
    # from the engine client taking it in (100.005) to its first scheduling (100.02)
    assert queue["duration_s"] == pytest.approx(0.015, abs=1e-6)
    assert queue["start_ts"].timestamp() == pytest.approx(1_741_064_100.005, abs=1e-6)
    assert queue["attributes"] == {R.ATTR_REQUEST_ID: "req-1"}
    assert by_name[R.SPAN_SAMPLING]["attributes"] == {R.ATTR_REQUEST_ID: "req-1",
                                                      R.ATTR_SAMPLING_STEPS: 3}
    request = by_name[R.SPAN_REQUEST]
    assert request["trace_id"] == TRACE and request["request_id"] == "req-1"
    assert request["duration_s"] == pytest.approx(0.1, abs=1e-6)
    assert request["attributes"][R.ATTR_POLICY_ACTIONS] == ["cap_max_tokens:256"]
    step = by_name[R.SPAN_STEP]
    assert step["request_id"] is None and step["parent_span_id"] is None
    assert step["duration_s"] == pytest.approx(0.02, abs=1e-6)
    assert step["attributes"][R.ATTR_STEP_TOKENS] == 316


def test_a_warm_up_step_is_marked_in_its_row_either_way():
    for make in (direct, otel):
        rows: list[dict] = []
        spans = make(rows.append)
        spans.step(StepRecord(1, 100.0, 0.05, 0.001, 2048, ("warmup-1",)), warmup=True)
        spans.step(StepRecord(2, 101.0, 0.01, 0.001, 16, ("req-9",)))
        warm, live = (json.loads(json.dumps(r["attributes"])) for r in rows)
        assert warm[R.ATTR_STEP_WARMUP] is True
        assert R.ATTR_STEP_WARMUP not in live
