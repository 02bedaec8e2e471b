"""The streamed response's write timeout (serving/streaming.py): one timer per stream
that cancels a write still under way after the timeout, and nothing else.

Through a real Starlette response on a real event loop; the client is an ASGI `send`
that completes at once, slowly, or never."""

from __future__ import annotations

import asyncio

from serving.streaming import TimedStreamingResponse


class _Record:
    request_id = "r1"

    def __init__(self) -> None:
        self.failed: tuple | None = None

    def fail(self, *args) -> None:
        self.failed = args


async def _chunks(n: int):
    for i in range(n):
        yield f"data: {i}\n\n"


def _serve(chunks: int, write_s, timeout_s: float) -> tuple[_Record, list[dict]]:
    """Stream `chunks` chunks through the response; each write takes `write_s(i)` s
    (None: it never completes). Returns the record and what the client received."""
    rec, received = _Record(), []

    async def send(message: dict) -> None:
        delay = write_s(len(received))
        if delay is None:
            await asyncio.Event().wait()  # a client that stopped reading
        await asyncio.sleep(delay)
        received.append(message)

    async def receive() -> dict:
        await asyncio.Event().wait()  # the client never disconnects
        return {"type": "http.disconnect"}

    async def main() -> None:
        response = TimedStreamingResponse(_chunks(chunks), timeout_s, rec,
                                          media_type="text/event-stream")
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "GET"}
        await asyncio.wait_for(response(scope, receive, send), 10)

    asyncio.run(main())
    return rec, received


def test_a_stream_slower_in_total_than_the_timeout_is_not_cut_when_each_write_is_quick():
    # 12 writes of 20 ms: 0.24 s in all, each far under the 0.1 s timeout
    rec, received = _serve(12, lambda i: 0.02, timeout_s=0.1)
    assert rec.failed is None
    bodies = [m for m in received if m["type"] == "http.response.body" and m.get("body")]
    assert len(bodies) == 12
    assert received[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_a_write_that_never_completes_ends_the_stream_as_a_write_timeout():
    rec, received = _serve(5, lambda i: 0.0 if i < 3 else None, timeout_s=0.2)
    assert rec.failed is not None and rec.failed[:2] == (499, "write_timeout")
    assert len(received) == 3  # the start and two chunks; the third write never ended


def test_a_write_slower_than_the_timeout_is_cut_even_after_quick_ones():
    # the watch re-arms for the write under way: a slow write late in the stream counts
    rec, _ = _serve(8, lambda i: 0.5 if i == 6 else 0.01, timeout_s=0.15)
    assert rec.failed is not None and rec.failed[1] == "write_timeout"
