"""Bad input on the real server: an OpenAI-style 4xx, a trace row, and service goes on."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

MODEL = "tailguard-tiny-llama"


def _completion(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}).encode()


def _chat(**fields) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4, **fields}).encode()


# (case, path, body, http status, error_type in the row and in error.code)
CASES = [
    ("truncated JSON", "/v1/completions", b'{"model": "x", "prompt": ', 400, "invalid_json"),
    ("invalid UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, "invalid_utf8"),
    ("a JSON array", "/v1/completions", b"[1, 2]", 400, "invalid_json"),
    ("wrong type for max_tokens", "/v1/completions", _completion(max_tokens="lots"), 400,
     "validation_error"),
    ("missing messages", "/v1/chat/completions", json.dumps({"model": MODEL}).encode(), 400,
     "validation_error"),
    ("empty prompt", "/v1/completions", _completion(prompt=""), 400, "empty_prompt"),
    ("prompt beyond the context", "/v1/completions", _completion(prompt="word " * 5000), 400,
     "context_length_exceeded"),
    ("zero max_tokens", "/v1/completions", _completion(max_tokens=0), 400, "invalid_max_tokens"),
    ("negative max_tokens", "/v1/chat/completions", _chat(max_tokens=-5), 400,
     "invalid_max_tokens"),
    ("absurd max_tokens", "/v1/completions", _completion(max_tokens=10**12), 400,
     "invalid_max_tokens"),
    ("unknown model", "/v1/completions", _completion(model="no-such-model"), 404,
     "model_not_found"),
    ("n over the limit", "/v1/completions", _completion(n=100), 400, "invalid_n"),
    ("control characters are fine", "/v1/completions", _completion(prompt="a\x00b\x1bc"), 200,
     None),
]


@pytest.mark.parametrize("case,path,body,status,error_type", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_a_clear_error_and_a_row(server, case, path, body, status, error_type):
    request_id = uuid.uuid4().hex
    response = httpx.post(server.url + path, content=body, timeout=60,
                          headers={"Content-Type": "application/json", "X-Request-Id": request_id})
    assert response.status_code == status, response.text
    row = server.sql(f"SELECT status, http_status, error_type FROM requests "
                     f"WHERE request_id = '{request_id}'")
    if status == 200:
        assert row == [{"status": "ok", "http_status": 200, "error_type": None}]
        return
    error = response.json()["error"]
    assert error["code"] == error_type and error["message"]
    assert error["type"] == "invalid_request_error"
    assert row == [{"status": "rejected", "http_status": status, "error_type": error_type}]


def test_huge_body_is_refused_with_413(server):
    request_id = uuid.uuid4().hex
    body = _completion(prompt="x" * (5 * 1024 * 1024))
    response = httpx.post(server.url + "/v1/completions", content=body, timeout=60,
                          headers={"X-Request-Id": request_id})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    rows = server.sql(f"SELECT http_status FROM requests WHERE request_id = '{request_id}'")
    assert rows == [{"http_status": 413}]


def test_server_still_serves_after_bad_input(server, client, model_name):
    for case in CASES[:4]:
        httpx.post(server.url + case[1], content=case[2], timeout=30)
    out = client.completions.create(model=model_name, prompt="still here", max_tokens=3)
    assert out.usage.completion_tokens == 3


def test_client_disconnect_mid_stream_aborts_the_engine_request(server):
    request_id = uuid.uuid4().hex
    body = _completion(prompt="long story", max_tokens=3000, stream=True, ignore_eos=True)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/completions", content=body,
                         headers={"X-Request-Id": request_id}) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
    row = _wait_for_row(server, request_id)
    assert (row["status"], row["http_status"], row["error_type"]) == \
        ("aborted", 499, "client_disconnected")
    assert 0 < row["output_tokens"] < 3000  # the engine stopped generating
    _wait_for_idle_engine(server)


def _wait_for_row(server, request_id: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = server.sql(f"SELECT * FROM requests WHERE request_id = '{request_id}'")
        if rows:
            return rows[0]
        time.sleep(0.2)
    raise AssertionError(f"no row for {request_id}")


def _wait_for_idle_engine(server, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "tailguard_requests_running 0.0" in server.metrics().replace(
                '{otel_scope_name="tailguard",otel_scope_schema_url="",otel_scope_version=""}', ""):
            return
        time.sleep(0.5)
    raise AssertionError("engine still running the aborted request")
