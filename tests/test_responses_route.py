"""`POST /v1/responses` is a generation route like chat: admitted, observed (row with
`endpoint = 'responses'`, spans as a chat, SLO verdict) and refused with a status
code, never with an error inside a started stream. Its wire format against vLLM's own
server is `test_compat`'s; the other vLLM endpoints' gates are here too."""

from __future__ import annotations

import json
import time

import httpx

from tests.conftest import ADMIN_TOKEN

NAME = "tailguard-tiny-llama"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def respond(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", timeout=120,
                      json={"model": NAME, "input": "Tell me about rivers.",
                            "max_output_tokens": 6, "temperature": 0, **body})


def row(server, resp: httpx.Response) -> dict:
    rid = resp.headers["x-request-id"]
    (found,) = server.sql(f"SELECT * FROM requests WHERE request_id = '{rid}'")
    return found


def events(resp: httpx.Response) -> list[tuple[str, dict]]:
    out = []
    for block in resp.text.strip().split("\n\n"):
        name, data = (line.split(": ", 1)[1] for line in block.splitlines())
        out.append((name, json.loads(data)))
    return out


def test_a_response_has_its_row_spans_and_verdict(server):
    resp = respond(server)
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    found = row(server, resp)
    assert (found["endpoint"], found["status"], found["stream"]) == ("responses", "ok", False)
    assert (found["prompt_tokens"], found["output_tokens"]) == (
        usage["input_tokens"], usage["output_tokens"])
    assert found["slo_ok"] is not None and found["ttft_s"] > 0
    spans = server.sql("SELECT name, attributes->>'$.\"gen_ai.operation.name\"' AS op "
                       f"FROM spans WHERE request_id = '{found['request_id']}'")
    names = {s["name"] for s in spans}
    assert {"llm.request", "llm.queue", "llm.prefill", "llm.decode"} <= names
    assert {s["op"] for s in spans if s["name"] == "llm.request"} == {"chat"}


def test_a_streamed_response_is_named_events_and_one_row(server):
    resp = respond(server, stream=True)
    assert resp.status_code == 200, resp.text
    got = events(resp)
    assert [name for name, _ in got[:2]] == ["response.created", "response.in_progress"]
    assert got[-1][0] == "response.completed"
    assert [data["sequence_number"] for _, data in got] == list(range(len(got)))
    usage = got[-1][1]["response"]["usage"]
    found = row(server, resp)
    assert (found["endpoint"], found["status"], found["stream"]) == ("responses", "ok", True)
    assert found["output_tokens"] == usage["output_tokens"]


def test_a_shed_response_is_a_503_with_retry_after_not_a_broken_stream(server):
    put = httpx.put(server.url + "/admin/policies/vip_only", headers=AUTH, timeout=30,
                    json={"mode": "force_on", "reason": "responses test", "ttl_s": 60})
    assert put.status_code == 200, put.text
    try:
        plain, streamed = respond(server), respond(server, stream=True)
    finally:
        httpx.put(server.url + "/admin/policies/vip_only", headers=AUTH, timeout=30,
                  json={"mode": "auto", "reason": "responses test done"})
    for resp in (plain, streamed):
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"]
        assert resp.json()["error"]["code"] == "shed"
        found = row(server, resp)
        assert (found["endpoint"], found["status"]) == ("responses", "rejected")
        assert found["policy_actions"] == ["shed:vip_only"]


def test_a_prompt_over_the_context_is_a_400_before_any_event(server):
    """The engine refuses it when first asked, after vLLM's handler has made the
    stream's opening events: those are held, so the client gets the status code."""
    resp = respond(server, stream=True, input="river " * 5000)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    found = row(server, resp)
    assert (found["endpoint"], found["status"], found["http_status"]) == (
        "responses", "rejected", 400)


def test_bad_bodies_get_openai_errors_and_the_server_keeps_serving(server):
    for body, status in (("{", 400), ("[]", 400), ('{"input": 5}', 400)):
        resp = httpx.post(server.url + "/v1/responses", content=body, timeout=30,
                          headers={"Content-Type": "application/json"})
        assert resp.status_code == status, (body, resp.text)
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    for path, body in (("/tokenize", "{"), ("/detokenize", '{"tokens": [-1]}')):
        resp = httpx.post(server.url + path, content=body, timeout=30,
                          headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, (path, resp.text)
    assert respond(server).status_code == 200


def test_load_counts_generation_requests_in_flight(server):
    """`/load` is what vLLM's `--enable-server-load-tracking` reports: requests
    in flight; idle it is 0, during a streamed response 1."""
    wait_load(server, 0)
    with httpx.stream("POST", server.url + "/v1/responses", timeout=120,
                      json={"model": NAME, "input": "x", "max_output_tokens": 1500,
                            "ignore_eos": True, "stream": True}) as resp:
        lines = resp.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(lines).startswith("event: response.created")
        assert httpx.get(server.url + "/load", timeout=10).json() == {"server_load": 1}
        assert sum(1 for _ in lines) > 1000
    wait_load(server, 0)  # the record is finished just after the stream's last byte


def wait_load(server, expected: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while (load := httpx.get(server.url + "/load", timeout=10).json()) != {
            "server_load": expected}:
        assert time.monotonic() < deadline, load
        time.sleep(0.05)


class _Event:
    """What vLLM's Responses stream yields: a typed pydantic event (here a stand-in)."""

    def __init__(self, type_: str, sequence_number: int):
        self.type, self.sequence_number = type_, sequence_number

    def model_dump_json(self, **_) -> str:
        return json.dumps({"type": self.type, "sequence_number": self.sequence_number})


class _Serving:
    def __init__(self, fail_after: int):
        self.fail_after = fail_after

    async def create_responses(self, request, raw):
        async def events():
            names = ["response.created", "response.in_progress", "response.output_text.delta",
                     "response.output_text.delta", "response.completed"]
            for number, name in enumerate(names):
                if number == self.fail_after:
                    raise RuntimeError("engine went away")
                yield _Event(name, number)
        return events()


class _Engine:
    def __init__(self, outcome=None):
        self._outcome = outcome

    def outcome(self, owner):
        return self._outcome


def _run(serving, engine):
    import asyncio

    from observe.record import RequestRecord
    from serving.compat.responses import ResponsesServing
    from serving.engine.observed import current_request

    async def go():
        rec = RequestRecord(request_id="r1", arrival=0.0, endpoint="responses")
        current_request.set(rec)
        stream = await ResponsesServing(serving, engine).create_responses(None, None)
        return rec, [chunk async for chunk in stream]

    return asyncio.run(go())


def test_a_refusal_when_the_engine_is_first_asked_raises_before_any_event():
    from serving.guard.verdicts import Refusal

    refusal = Refusal("deadline", "cannot meet it", 3, status=429)
    try:
        _run(_Serving(fail_after=2), _Engine(refusal))
    except RuntimeError as exc:  # `serving.generation._start` turns it into the 429
        assert str(exc) == "engine went away"
    else:
        raise AssertionError("the opening events went out before the engine answered")


def test_a_failure_inside_a_started_stream_ends_it_with_an_error_event():
    rec, chunks = _run(_Serving(fail_after=3), _Engine())
    assert [c.split("\n")[0] for c in chunks] == [
        "event: response.created", "event: response.in_progress",
        "event: response.output_text.delta", "event: error"]
    error = json.loads(chunks[-1].split("data: ", 1)[1])
    assert (error["sequence_number"], error["code"]) == (3, "engine_error")
    assert (rec.http_status, rec.error_type, rec.status) == (500, "engine_error", "error")
