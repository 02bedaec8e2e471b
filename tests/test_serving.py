"""End to end on the real engine: the openai SDK in, trace rows, spans and metrics out."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from observe import registry as R


def sample(metrics_text: str, name: str, **labels) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def row_for(server, request_id: str) -> dict:
    rows = server.sql(f"SELECT * FROM requests WHERE request_id = '{request_id}'")
    assert len(rows) == 1, rows
    return rows[0]


def spans_for(server, request_id: str) -> dict[str, dict]:
    rows = server.sql(f"SELECT * FROM spans WHERE request_id = '{request_id}'")
    by_name = {r["name"]: r for r in rows}
    assert len(by_name) == len(rows), "one span per name"
    return by_name


def test_non_streamed_completion_is_logged_with_consistent_phases(server, client, model_name):
    out = client.completions.create(model=model_name, prompt="The queue grows when", max_tokens=8)
    request_id = out.id.removeprefix("cmpl-")
    row = row_for(server, request_id)
    assert (row["status"], row["http_status"], row["finish_reason"]) == ("ok", 200, "length")
    assert row["prompt_tokens"] == out.usage.prompt_tokens
    assert row["output_tokens"] == out.usage.completion_tokens == 8
    assert row["iterations"] == 8  # one engine step per token, no speculation
    engine_s = row["queue_s"] + row["prefill_s"] + row["decode_s"]
    assert 0 < row["tokenize_s"] + engine_s <= row["e2e_s"]
    assert row["e2e_s"] - row["tokenize_s"] - engine_s < 0.1  # detokenizing + HTTP
    assert row["ttft_s"] <= row["e2e_s"]
    assert 0 < row["sampling_s"] < engine_s
    assert row["tpot_s"] == row["decode_s"] / 7
    # the short length class under the boundaries in force when it came (seed 000's
    # re-bucketing moves them with the session's traffic)
    low, high = row["length_class_low"], row["length_class_high"]
    assert 0 < low < high and row["context_bucket"] == "0-1k"
    assert row["batch_bucket"] == R.batch_bucket(row["prompt_tokens"], (low, high))
    assert row["slo_ttft_target_s"] == 0.2


def test_span_tree_uses_engine_times(server, client, model_name):
    out = client.completions.create(model=model_name, prompt="Spans from the engine", max_tokens=4)
    request_id = out.id.removeprefix("cmpl-")
    row, spans = row_for(server, request_id), spans_for(server, request_id)
    assert set(spans) == {R.SPAN_REQUEST, R.SPAN_TOKENIZE, *R.PHASE_SPANS}
    root = spans[R.SPAN_REQUEST]
    assert root["trace_id"] == row["trace_id"]
    for name in (R.SPAN_TOKENIZE, *R.PHASE_SPANS):
        assert spans[name]["parent_span_id"] == root["span_id"]
        assert spans[name]["trace_id"] == root["trace_id"]
    for name, column in [(R.SPAN_TOKENIZE, "tokenize_s"), (R.SPAN_QUEUE, "queue_s"),
                         (R.SPAN_PREFILL, "prefill_s"),
                         (R.SPAN_DECODE, "decode_s"), (R.SPAN_SAMPLING, "sampling_s")]:
        assert abs(spans[name]["duration_s"] - row[column]) < 2e-6, name
    attrs = json.loads(root["attributes"])
    assert attrs[R.ATTR_INPUT_TOKENS] == out.usage.prompt_tokens
    assert attrs[R.ATTR_OUTPUT_TOKENS] == 4
    assert attrs[R.ATTR_FINISH_REASONS] == ["length"]
    assert attrs[R.ATTR_REQUEST_MODEL] == model_name
    assert attrs[R.ATTR_CONTEXT_BUCKET] == "0-1k" and attrs[R.ATTR_PRIORITY] == "realtime"
    assert json.loads(spans[R.SPAN_SAMPLING]["attributes"])[R.ATTR_SAMPLING_STEPS] == 4


def test_engine_steps_are_spans_linked_to_their_requests(server, client, model_name):
    out = client.completions.create(model=model_name, prompt="Linked steps", max_tokens=3)
    root = spans_for(server, out.id.removeprefix("cmpl-"))[R.SPAN_REQUEST]
    steps = server.sql(
        "SELECT attributes FROM spans WHERE name = 'llm.step' AND "
        f"list_contains(CAST(json_extract(attributes, '$.links') AS VARCHAR[]), '{root['span_id']}')")
    assert len(steps) == 3
    for step in steps:
        attrs = json.loads(step["attributes"])
        assert attrs[R.ATTR_STEP_BATCH] >= 1 and attrs[R.ATTR_STEP_SAMPLING_S] > 0


def test_streamed_chat_is_logged_once_with_usage(server, client, model_name):
    stream = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Stream, please"}],
        max_tokens=6, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    usage = chunks[-1].usage
    request_id = chunks[0].id.removeprefix("chatcmpl-")
    row = row_for(server, request_id)
    assert (row["status"], row["endpoint"], row["stream"]) == ("ok", "chat", True)
    assert row["output_tokens"] == usage.completion_tokens == 6
    assert row["prompt_tokens"] == usage.prompt_tokens
    assert row["ttft_s"] < row["e2e_s"]


def test_traceparent_from_the_client_is_the_parent(server, client, model_name):
    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    out = client.completions.create(
        model=model_name, prompt="Traced", max_tokens=2,
        extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    root = spans_for(server, out.id.removeprefix("cmpl-"))[R.SPAN_REQUEST]
    assert (root["trace_id"], root["parent_span_id"]) == (trace_id, parent)


def test_metrics_count_exactly_the_requests_sent(server, client, model_name):
    labels = {"status": "ok", "context_bucket": "0-1k", "priority": "realtime"}
    before = server.metrics()
    for _ in range(3):
        client.completions.create(model=model_name, prompt="count me", max_tokens=2)
    after = server.metrics()
    assert sample(after, "tailguard_requests_total", **labels) - \
        sample(before, "tailguard_requests_total", **labels) == 3
    ttft = "gen_ai_server_time_to_first_token_seconds_count"
    assert sample(after, ttft, context_bucket="0-1k") - sample(before, ttft, context_bucket="0-1k") == 3
    slo = "tailguard_slo_requests_total"
    assert sample(after, slo, slo="ttft") - sample(before, slo, slo="ttft") == 3
    for judged in ("tailguard_prediction_ttft_judged_total",  # each one predicted, then judged
                   "tailguard_prediction_ttft_error_ratio_count"):
        assert sample(after, judged, context_bucket="0-1k") - \
            sample(before, judged, context_bucket="0-1k") == 3, judged


def test_sixteen_concurrent_requests_all_complete_and_are_logged(server, client, model_name):
    def one(i: int) -> str:
        out = client.completions.create(model=model_name, prompt=f"request {i} " * (i + 1),
                                        max_tokens=5)
        return out.id.removeprefix("cmpl-")

    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(one, range(16)))
    quoted = ",".join(f"'{i}'" for i in ids)
    rows = server.sql(f"SELECT status, output_tokens FROM requests WHERE request_id IN ({quoted})")
    assert sorted((r["status"], r["output_tokens"]) for r in rows) == [("ok", 5)] * 16


def test_engine_stats_are_written_every_second(server, client, model_name):
    """The request's 16 tokens are in the seconds around it. Token counts are vLLM's
    (its iteration stats) and steps the probe's: the two reach the accumulator from
    different threads, so a step and its tokens may land in neighbouring seconds."""
    began = server.sql("SELECT now() AS t")[0]["t"]
    client.completions.create(model=model_name, prompt="tick", max_tokens=16,
                              extra_body={"ignore_eos": True})
    since = f"FROM engine_stats WHERE ts >= TIMESTAMPTZ '{began}' - INTERVAL 1 SECOND"
    deadline = time.monotonic() + 10
    while (server.sql(f"SELECT coalesce(sum(generation_tokens), 0) AS n {since}")[0]["n"]
           < 16):  # the second holding the last token closes within a second
        assert time.monotonic() < deadline, server.sql(f"SELECT * {since}")
        time.sleep(0.2)
    busy = server.sql(f"SELECT * {since} AND steps > 0")
    assert busy and max(r["mean_batch_size"] for r in busy) >= 1
    assert all(0 <= r["kv_cache_usage"] <= 1 and r["mean_sampling_s"] > 0 for r in busy)
