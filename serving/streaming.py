"""The streamed side of a generation: vLLM's SSE chunks passed through to the client,
failures inside a started stream reported as ours, and a write timeout for clients
that stop reading.

A stream's engine request frees its engine slot as soon as the engine is done with
it (`ObservedEngine` follows its outputs as vLLM hands them over), so a client that
never reads holds no engine capacity; the write timeout then bounds how long it holds
a connection and a response task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from observe import registry as R
from serving.engine.observed import current_request
from serving.errors import from_outcome

log = logging.getLogger("tailguard")
CLIENT_CLOSED = 499  # nginx's code for "client closed request"
STREAM_ERROR_PREFIX = 'data: {"error"'  # how vLLM reports a failure inside a started stream
WRITE_TIMEOUT = "write_timeout"


class StalledClient(Exception):
    """One write to the client did not complete within the write timeout."""


class TimedStreamingResponse(StreamingResponse):
    """A `StreamingResponse` whose every write must complete within `write_timeout_s`.

    A client that stops reading fills its TCP window and then uvicorn's `send` waits
    forever. Past the timeout the response gives up without completing; uvicorn then
    closes the connection (logging "returned without completing response"), and the
    record is finished as aborted with error type `write_timeout`.

    One timer per stream watches the write under way, rather than `asyncio.wait_for`
    around each write: that made a task and a timer per chunk (~8 us each, a chunk per
    token), where a write that does not block needs neither."""

    def __init__(self, content, write_timeout_s: float, rec, **kwargs):
        super().__init__(content, **kwargs)
        self.write_timeout_s = write_timeout_s
        self.rec = rec

    async def __call__(self, scope, receive, send) -> None:
        watch = _WriteWatch(self.write_timeout_s)

        async def timed_send(message) -> None:
            watch.begin()
            try:
                await send(message)
            except asyncio.CancelledError:
                if watch.expired():
                    raise StalledClient from None
                raise
            finally:
                watch.end()

        try:
            await super().__call__(scope, receive, timed_send)
        except StalledClient:
            stalled(self.rec)
            log.warning("request %s: the client read nothing for %g s; stream aborted",
                        self.rec.request_id, self.write_timeout_s)
        finally:
            watch.close()
            await self.body_iterator.aclose()  # finishes the record if not done yet


class _WriteWatch:
    """Cancels the task of a write that has not completed within `timeout_s`; one
    timer for the whole stream, re-armed for when the write under way would expire."""

    __slots__ = ("timeout_s", "_loop", "_since", "_writer", "_timer", "_expired")

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None  # loop time the write under way began
        self._writer: asyncio.Task | None = None
        self._expired = False
        self._timer = self._loop.call_later(timeout_s, self._check)

    def begin(self) -> None:
        self._writer = asyncio.current_task()
        self._since = self._loop.time()

    def end(self) -> None:
        self._since = None

    def expired(self) -> bool:
        """True (once, and the cancellation taken back) when the watch cancelled it."""
        if not self._expired:
            return False
        self._expired = False
        self._writer.uncancel()
        return True

    def _check(self) -> None:
        since, now = self._since, self._loop.time()
        if since is not None and now - since >= self.timeout_s:
            self._expired = True
            self._writer.cancel()
            return
        wait = self.timeout_s if since is None else since + self.timeout_s - now
        self._timer = self._loop.call_later(wait, self._check)

    def close(self) -> None:
        self._timer.cancel()


def stalled(rec) -> None:
    rec.fail(CLIENT_CLOSED, WRITE_TIMEOUT, "the client stopped reading the stream",
             R.STATUS_ABORTED)


class Started:
    """vLLM's stream with its first chunk read already (None: it had none), so that
    admission could still refuse it with a status code."""

    __slots__ = ("first", "rest")

    def __init__(self, first: str | None, rest: AsyncIterator[str]):
        self.first, self.rest = first, rest


async def observed_stream(started: Started, rec, span, observer, engine):
    """Pass vLLM's SSE chunks through; finish the record (`observer`) when the stream
    ends. `engine`: the observed engine serving it. The first chunk is yielded here
    rather than by a generator in front: one layer less for every chunk."""
    current_request.set(rec)  # this generator runs in the response task's context
    chunks = started.rest
    try:
        if started.first is not None:
            yield _checked(started.first, engine, rec)
        async for chunk in chunks:
            if chunk.startswith(STREAM_ERROR_PREFIX):
                chunk = _stream_error(engine, rec, chunk)
            yield chunk
    except (asyncio.CancelledError, GeneratorExit):
        if rec.error_type is None:  # a write timeout has named the cause already
            rec.fail(CLIENT_CLOSED, "client_disconnected", "client went away mid-stream",
                     R.STATUS_ABORTED)
        raise
    finally:
        rec.end = time.monotonic()
        # In a task of its own: a client gone mid-read cancels this task's scope for
        # good (anyio re-raises at every later await in it), and the record must still
        # be completed and finished.
        closing = asyncio.ensure_future(_close(chunks, rec, span, observer, engine))
        _closing.add(closing)
        closing.add_done_callback(_closing.discard)
        await asyncio.shield(closing)


_closing: set[asyncio.Task] = set()  # strong references until each has run


async def _close(chunks: AsyncIterator[str], rec, span, observer, engine) -> None:
    try:
        await chunks.aclose()  # ends the engine requests now if they still run
        await settle(engine, rec)
    finally:
        observer.finish(rec, span)


async def settle(engine, rec) -> None:
    """Every engine request of `rec` on `engine` (None: none started) has ended and
    added its outcome to it."""
    if engine is not None:
        await engine.settle(rec.request_id)


def _checked(chunk: str, engine, rec) -> str:
    return _stream_error(engine, rec, chunk) if chunk.startswith(STREAM_ERROR_PREFIX) \
        else chunk


def _stream_error(engine, rec, chunk: str) -> str:
    """vLLM reports a failure inside a started stream as an error event; the event to
    send instead (ours, when we know better: the engine died or hung under it)."""
    outcome = engine.outcome(rec.request_id)
    if outcome is not None:
        error = from_outcome(outcome)
        rec.fail(error.status, error.error_type, error.message, error.outcome)
        err = json.loads(error.response().body)["error"]
        err["code"] = error.status  # in a stream, vLLM's convention: the HTTP status
        return f"data: {json.dumps({'error': err})}\n\n"
    try:
        err = json.loads(chunk[len("data: "):])["error"]
        status = int(err.get("code") or 500)
    except (ValueError, KeyError, TypeError):
        status, err = 500, {"message": chunk.strip()}
    rec.fail(status, "engine_error" if status >= 500 else "invalid_request",
             str(err.get("message")), R.STATUS_ERROR if status >= 500 else R.STATUS_REJECTED)
    return chunk
