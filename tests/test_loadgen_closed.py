"""The closed-loop load generator keeps exactly N requests in flight until its
duration ends, and a slower server completes fewer: a comparison it makes can fail."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from loadgen.runner import Target, run_closed
from loadgen.workload import Workload
from tests.conftest import free_port

TOKENS = 4


class FakeServer:
    """Streams TOKENS completion chunks, `delay_s` apart; counts requests in flight."""

    def __init__(self, delay_s: float):
        self.delay_s, self.in_flight, self.most_in_flight, self.started = delay_s, 0, 0, 0
        self.last_start = 0.0
        self.refuse_with: str | None = None  # a Retry-After value: refuse everything

    async def completions(self, request):
        await request.json()
        if self.refuse_with is not None:
            self.started += 1
            return JSONResponse({"error": {"code": "shed", "message": "busy"}}, 503,
                                headers={"Retry-After": self.refuse_with})
        self.in_flight += 1
        self.started += 1
        self.last_start = time.monotonic()
        self.most_in_flight = max(self.most_in_flight, self.in_flight)

        async def chunks():
            try:
                for _ in range(TOKENS):
                    await asyncio.sleep(self.delay_s)
                    yield "data: " + json.dumps({"choices": [{"text": "x"}]}) + "\n\n"
                usage = {"prompt_tokens": 5, "completion_tokens": TOKENS}
                yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                self.in_flight -= 1

        return StreamingResponse(chunks(), media_type="text/event-stream")


@pytest.fixture
def serve():
    running = []

    def start(delay_s: float) -> tuple[str, FakeServer]:
        fake = FakeServer(delay_s)
        app = Starlette(routes=[Route("/v1/completions", fake.completions, methods=["POST"])])
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        running.append(server)
        return f"http://127.0.0.1:{port}", fake

    yield start
    for server in running:
        server.should_exit = True


def _closed(url: str, concurrency: int, duration_s: float):
    workload = Workload("steady", 200.0, duration_s, 1000, output_tokens=TOKENS)
    start = time.monotonic()
    results = asyncio.run(run_closed(Target(url, "m"), workload, concurrency))
    return results, start


def test_exactly_n_in_flight_and_no_send_after_the_duration(serve):
    url, fake = serve(0.02)
    results, start = _closed(url, concurrency=5, duration_s=1.0)
    assert fake.most_in_flight == 5
    assert all(r.status == "ok" and r.output_tokens == TOKENS for r in results)
    assert len(results) == fake.started
    assert max(r.sent_s for r in results) < 1.0
    assert fake.last_start - start < 1.0 + 0.5  # the last send left before the end
    # A request takes at least TOKENS x 20 ms (a sleep never ends early): a client sends
    # one every 80 ms at best, 13 in 1 s. Below, no timing: each client sent again once
    # its first was done (the clean-clone CI's busy machine did 20 in all, not ~60).
    assert 2 * 5 <= len(results) <= 5 * (int(1.0 / (TOKENS * 0.02)) + 1)


def test_a_slower_server_completes_fewer(serve):
    fast_url, _ = serve(0.01)
    slow_url, _ = serve(0.04)
    fast, _ = _closed(fast_url, concurrency=4, duration_s=1.0)
    slow, _ = _closed(slow_url, concurrency=4, duration_s=1.0)
    assert len(fast) > 2 * len(slow) > 0


def test_no_clients_or_no_arrivals_send_nothing(serve):
    url, fake = serve(0.01)
    assert _closed(url, concurrency=0, duration_s=0.5)[0] == []
    assert fake.started == 0


def test_a_refused_client_waits_its_retry_after_instead_of_spinning(serve):
    url, fake = serve(0.01)
    fake.refuse_with = "0.5"
    results, _ = _closed(url, concurrency=3, duration_s=1.0)
    # each client: refused at ~0 s and ~0.5 s, then the duration is over
    assert len(results) == fake.started == 6
    assert all(r.status == "error" and r.error_type == "shed" and r.retry_after_s == 0.5
               for r in results)


def test_an_unreadable_retry_after_is_none(serve):
    url, fake = serve(0.01)
    fake.refuse_with = "Wed, 21 Oct 2015 07:28:00 GMT"
    results, _ = _closed(url, concurrency=1, duration_s=0.2)
    assert results and all(r.retry_after_s is None for r in results)
