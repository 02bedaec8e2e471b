"""TTFT is the time to the engine's first token, streamed or not.

A non-streamed request gets a single output from vLLM (FINAL_ONLY), at its end; its
TTFT must still end at the first token vLLM generated, not at that output. The unit
tests pin the computation on hand-set stamps (and on vLLM's own stats code); the
server tests check every route, streamed and not, against vLLM's own TTFT figure.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from observe.record import RequestRecord
from observe.stats import EngineTimes, WallClock

OFFSET = 1_000_000.0  # wall clock = monotonic + OFFSET
CLOCK = WallClock(offset=OFFSET)
MAX_TOKENS = 64  # with ignore_eos: decode time is clearly visible on the tiny model
# vLLM's TTFT starts at its `arrival_time`, which its renderer stamps before the chat
# template and tokenizing (admission comes later still); ours at HTTP arrival. The
# difference is the row's `tokenize_s` (reading and checking the HTTP request): exactly,
# as measured, unless the wall clock moved since start and the conversion of
# `arrival_time` was clamped to `queued_ts`, which this tolerance covers.
HANDOFF_TOLERANCE_S = 0.05
# The engine core stamps the first token (`first_token_ts`, the prefill's end) before
# its output crosses to the engine client in this process, where TTFT ends.
TRANSPORT_TOLERANCE_S = 0.1


def _stats(**kw):
    """vLLM RequestStateStats of a request the engine client took in at monotonic 10.2
    (wall clock), whose first token the engine core made at 11.0 and the engine client
    handled at 11.02 (first_token_latency 0.82), last token at 13.0."""
    base = dict(arrival_time=OFFSET + 10.2, queued_ts=10.3, scheduled_ts=10.5,
                first_token_ts=11.0, last_token_ts=13.0, first_token_latency=0.82,
                num_preemptions=0)
    return SimpleNamespace(**{**base, **kw})


def _record(first_token: float, stats=None) -> RequestRecord:
    rec = RequestRecord("r", arrival=10.0, endpoint="completions", output_tokens=21,
                        first_token=first_token, end=13.05)
    rec.engine = EngineTimes.from_vllm(stats or _stats(), CLOCK)
    return rec


def test_a_non_streamed_requests_ttft_ends_at_the_engines_first_token_not_its_only_output():
    rec = _record(first_token=13.01)  # FINAL_ONLY: the server saw tokens only at the end
    assert rec.first_token_at == pytest.approx(11.02)
    assert rec.ttft_s == pytest.approx(1.02)
    assert rec.e2e_s == pytest.approx(3.05)
    assert rec.tpot_s == pytest.approx(2.0 / 20)  # (last - first token) / (n - 1), engine stamps


def test_ttft_is_the_pre_engine_time_plus_vllms_own_ttft():
    rec = _record(first_token=13.01)
    assert rec.tokenize_s == pytest.approx(0.2)
    assert rec.ttft_s - rec.tokenize_s == pytest.approx(0.82)  # vLLM's first_token_latency


def test_a_streamed_request_is_timed_the_same_way():
    streamed = _record(first_token=11.021)  # the pump saw the first delta a hop later
    assert streamed.ttft_s == pytest.approx(1.02)


def test_ttft_is_at_least_tokenize_queue_and_prefill():
    rec = _record(first_token=13.01)
    engine = rec.engine
    assert rec.tokenize_s + engine.queue_s + engine.prefill_s == pytest.approx(1.0)
    assert rec.ttft_s >= rec.tokenize_s + engine.queue_s + engine.prefill_s


def test_a_wall_clock_step_never_puts_the_first_token_before_the_engine_made_it():
    stepped = _stats(arrival_time=OFFSET + 9.0)  # the wall clock went back 1.2 s
    assert _record(first_token=13.01, stats=stepped).first_token_at == 11.0


def test_without_a_first_token_in_the_stats_the_servers_observation_counts():
    no_token = _stats(first_token_ts=0.0, last_token_ts=0.0, first_token_latency=0.0)
    assert _record(first_token=12.0, stats=no_token).ttft_s == pytest.approx(2.0)
    bare = RequestRecord("r", arrival=10.0, endpoint="completions", first_token=12.5)
    assert bare.ttft_s == 2.5
    assert RequestRecord("r", arrival=10.0, endpoint="completions").ttft_s is None


def test_several_engine_requests_take_the_earliest_first_token():
    late = EngineTimes.from_vllm(_stats(), CLOCK)
    early = EngineTimes.from_vllm(_stats(first_token_ts=10.8, first_token_latency=0.65), CLOCK)
    assert late.merge(early).first_token_seen == pytest.approx(10.85)
    assert early.merge(late).first_token_seen == pytest.approx(10.85)
    unseen = EngineTimes(10.0, 10.1, 10.2, 10.3)
    assert unseen.merge(late).first_token_seen == pytest.approx(11.02)


def test_absorbing_two_final_outputs_keeps_the_earliest_first_token():
    from serving.engine.outputs import absorb

    def final(stats, tokens):
        return SimpleNamespace(prompt_token_ids=[1, 2, 3], metrics=stats, outputs=[
            SimpleNamespace(finish_reason="length", token_ids=list(range(tokens)))])

    rec = RequestRecord("r", arrival=10.0, endpoint="completions", queued_at=10.1)
    rec.first_token = 13.01
    absorb(rec, final(_stats(), 21), 21, CLOCK)
    absorb(rec, final(_stats(first_token_ts=11.5, first_token_latency=1.31), 21), 21, CLOCK)
    assert rec.ttft_s == pytest.approx(1.02)
    assert rec.tokenize_s == pytest.approx(0.1)  # admission began at 10.1: queueing from there


def test_vllms_own_stats_code_fills_what_we_read():
    """Drive vLLM's IterationStats as its output processor does, with set clocks."""
    from vllm.v1.metrics.stats import IterationStats, RequestStateStats

    def output(tokens):
        return SimpleNamespace(new_token_ids=tokens, prefill_stats=None, events=None,
                               num_nans_in_logits=0)

    stats = RequestStateStats(arrival_time=OFFSET + 10.2)
    stats.queued_ts, stats.scheduled_ts = 10.3, 10.5
    first = IterationStats()
    first.iteration_timestamp = OFFSET + 11.02  # the engine client's time.time()
    first.update_from_output(output([7]), 11.0, True, stats, None, None)
    later = IterationStats()
    later.iteration_timestamp = OFFSET + 13.02
    later.update_from_output(output([8]), 13.0, False, stats, None, None)
    assert first.time_to_first_tokens_iter == [pytest.approx(0.82)]  # vLLM's TTFT metric
    times = EngineTimes.from_vllm(stats, CLOCK)
    assert (times.first_token, times.last_token) == (11.0, 13.0)
    assert times.first_token_seen == pytest.approx(11.02)


# --- the real server ---------------------------------------------------------------

def _vllm_ttft(metrics_text: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name.startswith("vllm:time_to_first_token_seconds_"):
                found[s.name] = found.get(s.name, 0.0) + s.value
    return (found["vllm:time_to_first_token_seconds_count"],
            found["vllm:time_to_first_token_seconds_sum"])


def _completion(client, model, stream: bool) -> tuple[str, float | None]:
    kw = dict(model=model, prompt="The first token of a long answer", max_tokens=MAX_TOKENS,
              extra_body={"ignore_eos": True})
    if not stream:
        return client.completions.create(**kw).id.removeprefix("cmpl-"), None
    return _drain(lambda: client.completions.create(stream=True, **kw), "cmpl-")


def _chat(client, model, stream: bool) -> tuple[str, float | None]:
    kw = dict(model=model, messages=[{"role": "user", "content": "Answer at length"}],
              max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
    if not stream:
        return client.chat.completions.create(**kw).id.removeprefix("chatcmpl-"), None
    return _drain(lambda: client.chat.completions.create(stream=True, **kw), "chatcmpl-")


def _drain(open_stream, prefix: str) -> tuple[str, float]:
    """The request id and how long the client waited for the first chunk."""
    start = time.monotonic()
    chunks = iter(open_stream())
    first = next(chunks)
    client_ttft_s = time.monotonic() - start
    for _ in chunks:
        pass
    return first.id.removeprefix(prefix), client_ttft_s


@pytest.mark.parametrize("stream", [False, True], ids=["non-streamed", "streamed"])
@pytest.mark.parametrize("send", [_completion, _chat], ids=["completion", "chat"])
def test_ttft_is_the_engines_first_token_and_agrees_with_vllms(server, client, model_name,
                                                                send, stream):
    count0, sum0 = _vllm_ttft(server.metrics())
    request_id, client_ttft_s = send(client, model_name, stream)
    count1, sum1 = _vllm_ttft(server.metrics())
    rows = server.sql(f"SELECT * FROM requests WHERE request_id = '{request_id}'")
    assert len(rows) == 1, rows
    row = rows[0]
    assert (row["status"], row["stream"], row["output_tokens"]) == ("ok", stream, MAX_TOKENS)
    assert count1 - count0 == 1, "another request ran meanwhile"
    vllm_ttft = sum1 - sum0

    # The answer's decode is clearly visible, and TTFT ends before it, not at the end.
    assert row["decode_s"] > 0.05
    assert row["ttft_s"] < row["e2e_s"] - row["decode_s"] / 2
    # No earlier than the engine core made the first token, and not much later.
    to_first_token = row["tokenize_s"] + row["queue_s"] + row["prefill_s"]
    assert to_first_token - 1e-6 <= row["ttft_s"] <= to_first_token + TRANSPORT_TOLERANCE_S
    # vLLM's own figure plus what happened before vLLM's clock started.
    pre_engine = row["ttft_s"] - vllm_ttft
    assert row["tokenize_s"] - 1e-6 <= pre_engine <= row["tokenize_s"] + HANDOFF_TOLERANCE_S
    if stream:  # the client cannot have seen a token before the server had one
        assert client_ttft_s >= row["ttft_s"] - 1e-3
