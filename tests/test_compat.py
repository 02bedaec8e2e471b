"""tailguard as a drop-in for `vllm serve`: vLLM's own OpenAI server and tailguard, on
the same embedded model and engine flags, get the same requests (greedy decoding) and
must give the same status codes, the same JSON shapes and the same generated text and
usage, endpoint by endpoint (docs/compatibility.md is the table of what this tests).

Deliberate differences are named in `DELIBERATE` with the reason; nothing else may
differ. Ids and clocks (`id`, `created`, ...) are compared by type only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest

from tests.compat_cases import (
    CASES, DELIBERATE, NAME, Case, comparable, shape, stream_view,
)
from tests.conftest import free_port, stop_server


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    """vLLM's own OpenAI server, started as its CPU guide starts it, with the flags
    `tailguard serve` gives the engine (eager, in-process executor, the CPU's dtype)."""
    from serving.engine.embedded_model import ensure_model
    from serving.engine.setup import DEFAULT_VLLM_FLAGS, cpu_dtype_flags

    tmp = tmp_path_factory.mktemp("vllm")
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(ensure_model()), "--served-model-name", NAME, "--host", "127.0.0.1",
           "--port", str(port), "--disable-uvicorn-access-log", *DEFAULT_VLLM_FLAGS,
           *cpu_dtype_flags([])]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    log = tmp / "vllm.log"
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, process, log)
    yield url
    stop_server(SimpleNamespace(process=process))


def _wait_healthy(url: str, process, log, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM's server exited:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    raise RuntimeError(f"vLLM's server not ready:\n{log.read_text()[-4000:]}")


def send(url: str, case: Case) -> tuple[int, object]:
    """(status, body): JSON, or for a stream the list of its parsed SSE events."""
    with httpx.Client(base_url=url, timeout=120) as http:
        resp = http.request(case.method, case.path, json=case.body)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            return resp.status_code, _events(resp.text)
        if not resp.content:
            return resp.status_code, None
        try:
            return resp.status_code, resp.json()
        except json.JSONDecodeError:
            return resp.status_code, resp.text


def _events(text: str) -> list:
    """Each SSE event as (event name, parsed data); `[DONE]` kept as text."""
    events = []
    for block in text.strip().split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_tailguard_answers_as_vllm_does(case: Case, vllm_url, server):
    theirs_status, theirs = send(vllm_url, case)
    ours_status, ours = send(server.url, case)
    assert ours_status == theirs_status, (theirs, ours)
    if case.body and case.body.get("stream") and ours_status == 200:
        theirs, ours = stream_view(theirs), stream_view(ours)
    deliberate = DELIBERATE.get(case.name)
    if deliberate is not None:
        theirs, ours = deliberate.adjust(theirs), deliberate.adjust(ours)
    assert shape(ours) == shape(theirs)
    assert comparable(ours) == comparable(theirs)


def vllm_series(url: str) -> dict[tuple, float]:
    """Every counter and histogram sample of vLLM's own `vllm:*` series on /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    samples = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:") or family.type not in ("counter", "histogram"):
            continue
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def moved(before: dict, after: dict) -> dict:
    return {key: value - before.get(key, 0.0) for key, value in after.items()
            if value != before.get(key, 0.0)}


def test_every_vllm_series_vllm_moves_moves_alike_under_tailguard(vllm_url, server):
    """Dashboards built on vLLM's series keep working: after the same requests, each
    `vllm:*` series that vLLM's server moved moved under tailguard by the same count
    (token histograms' sums and buckets exactly; time sums within noise). A fresh
    prompt prefix per run keeps the prefix cache's hits equal on both."""
    nonce = os.urandom(4).hex()
    cases = [replace_prompt(case, nonce) for case in CASES
             if case.name in ("completion", "completion_stream", "chat", "chat_stream",
                              "responses", "responses_stream")]
    urls = {"vllm": vllm_url, "tailguard": server.url}
    before = {side: vllm_series(url) for side, url in urls.items()}
    for case in cases:
        for url in urls.values():
            assert send(url, case)[0] == 200
    deltas = {side: moved(before[side], vllm_series(url)) for side, url in urls.items()}
    theirs, ours = deltas["vllm"], deltas["tailguard"]
    assert theirs, "vLLM's server moved no series: nothing compared"
    exact = {key: value for key, value in theirs.items() if not _timed(key[0])}
    assert {key: ours.get(key) for key in exact} == exact
    for key, value in theirs.items():  # times: the same order, not the same clock
        if key[0].endswith("_sum") and _timed(key[0]):
            assert key in ours and abs(ours[key] - value) <= max(1.0, value), (key, value)


def _timed(name: str) -> bool:
    """A seconds histogram's sum or bucket: it measures a clock."""
    return "seconds" in name and name.endswith(("_sum", "_bucket"))


def replace_prompt(case: Case, nonce: str) -> Case:
    body = dict(case.body)
    lead = f"[{nonce}] "
    if "prompt" in body:
        body["prompt"] = lead + body["prompt"]
    elif "messages" in body:
        body["messages"] = [dict(m, content=lead + m["content"]) for m in body["messages"]]
    else:
        body["input"] = lead + body["input"]
    return Case(case.name, case.method, case.path, body)


def test_the_compatibility_table_is_what_the_suite_tests():
    """docs/compatibility.md's "supported" rows are the routes the cases serve (and
    `/metrics`, which the series test compares); refusals are cases of their own."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "compatibility.md").read_text()
    supported = set()
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[2] == "supported":
            for route in cells[0].split(","):
                method, path = route.strip().strip("`").split(" ")
                supported.add((method, path))
    tested = {(case.method, case.path) for case in CASES if not case.name.startswith("error_")}
    assert supported == tested | {("GET", "/metrics")}
