"""What vLLM's engine outputs tell the request's record: the prompt length of what
vLLM hands the engine, whether its outputs are deltas, each engine request's outputs
seen as vLLM's collector receives them (`EngineRequest`), and its outcome added to
the record."""

from __future__ import annotations

import asyncio
import logging
import time
from contextvars import ContextVar
from dataclasses import replace

from observe.record import RequestRecord
from observe.stats import EngineTimes, WallClock

log = logging.getLogger("tailguard")


def prompt_length(prompt) -> int:
    """Prompt tokens of what vLLM's serving classes hand the engine: a tokenized
    prompt dict (or an `EngineCoreRequest`); 0 when it is not tokenized yet."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(
        prompt, "prompt_token_ids", None)
    return len(ids) if ids is not None else 0


def is_delta(sampling_params) -> bool:
    """Streaming asks vLLM for deltas: token counts must then be summed."""
    kind = getattr(sampling_params, "output_kind", None)
    return getattr(kind, "name", "") == "DELTA"


def absorb(rec: RequestRecord, out, output_tokens: int, clock: WallClock) -> None:
    """Add one engine request's outcome to the record (a completion with several
    prompts makes several engine requests)."""
    rec.prompt_tokens += len(out.prompt_token_ids or ())
    rec.output_tokens += output_tokens
    reasons = [o.finish_reason for o in out.outputs if o.finish_reason]
    if reasons:
        rec.finish_reason = reasons[0]
    times = EngineTimes.from_vllm(out.metrics, clock)
    if times is not None and rec.queued_at is not None and times.accepted is not None:
        # waiting for an engine slot (the concurrency limit) is queueing too
        times = replace(times, accepted=min(times.accepted, rec.queued_at))
    if times is not None:
        rec.engine = times if rec.engine is None else rec.engine.merge(times)


# The engine request this task is about to submit: the collector vLLM makes for it
# (`watched_collector`) takes it, so it sees each output as the engine hands it over.
next_watch: ContextVar[EngineRequest | None] = ContextVar("tailguard_next_watch",
                                                          default=None)


class EngineRequest:
    """One engine request, followed through vLLM's own collector for it: each output
    as vLLM's output handler puts it there (not when the client reads it) gives the
    first token, the prefill's end and the token count; the last one (finished,
    aborted, or a failure) ends it at once: `engine.request_ended(self)` gives its
    engine slot back and adds its outcome to the record. A client that reads slowly,
    or never, so holds no engine capacity, and no task or second queue is needed per
    request to make sure of it."""

    __slots__ = ("engine", "rec", "request_id", "prefill", "deltas", "internal_id",
                 "tokens", "last", "failed", "done", "_waiters")

    def __init__(self, engine, rec: RequestRecord, request_id: str, prefill, deltas: bool):
        self.engine, self.rec, self.request_id = engine, rec, request_id
        self.prefill, self.deltas = prefill, deltas
        self.internal_id: str | None = None  # vLLM's id, once its collector exists
        self.tokens = 0
        self.last = None  # the latest output
        self.failed = self.done = False
        self._waiters: list[asyncio.Future] | None = None

    def seen(self, output) -> None:
        """vLLM put `output` (a `RequestOutput`, or the exception that ends it)."""
        if self.done:
            return
        if isinstance(output, Exception):
            self.failed = True
            self.engine.request_failed(self.rec, output)
            self.end()
            return
        now = self.engine.progress_at = time.monotonic()
        new = sum(len(o.token_ids) for o in output.outputs)
        if new:
            if self.rec.first_token is None:
                self.rec.first_token = now
            self.prefill.ended()
        self.tokens = self.tokens + new if self.deltas else new
        self.last = output
        if output.finished:
            self.end()

    def end(self) -> None:
        """It is over (once): its slot back, its outcome on the record."""
        if self.done:
            return
        self.done = True
        self.engine.request_ended(self)
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def ended(self) -> asyncio.Future:
        """Done once `end()` has run."""
        waiter = asyncio.get_running_loop().create_future()
        if self.done:
            waiter.set_result(None)
        else:
            self._waiters = [*(self._waiters or ()), waiter]
        return waiter


def watched_collector(base: type) -> type:
    """vLLM's `RequestOutputCollector` (`base`) that hands every output it is given to
    the `EngineRequest` its task named in `next_watch`, if any. vLLM's `generate()`
    makes the collector itself; this is the one place its outputs can be seen as they
    come, without a reader of our own."""

    class WatchedCollector(base):
        watched = True

        def __init__(self, output_kind, request_id: str):
            super().__init__(output_kind, request_id)
            self.watch = watch = next_watch.get()
            if watch is not None:
                next_watch.set(None)  # one collector per engine request
                watch.internal_id = request_id

        def put(self, output) -> None:
            super().put(output)
            if self.watch is not None:
                try:
                    self.watch.seen(output)
                except Exception:  # in vLLM's output handler: a raise would fail them all
                    log.exception("engine request %s: its output could not be followed",
                                  self.request_id)

    return WatchedCollector
