"""The client wrapper that observes the in-process vLLM engine (`AsyncLLM`, built in
`serving/engine/setup.py`; its processes are found in `serving/engine/processes.py`).

vLLM's OpenAI serving classes run on `ObservedEngine`, which only watches
`generate()`: the wire format stays vLLM's, byte for byte.

`ObservedEngine` also notices the engine failing under its requests (what each fault
means to a request: `serving/engine/failures.py`). A crashed engine
core (vLLM raises `EngineDeadError` into every request) and a hung one (requests in
flight, no engine step for `TAILGUARD_ENGINE_HANG_S` seconds: the watchdog, run by the
guard's tick, kills it) both leave `errored` true, which breaker L2 restarts on, and
each request in flight ends with an `EngineFailure` (`engine_dead`/`engine_hung`),
which the HTTP layer reads back with `outcome()` and answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable

import psutil

from observe.record import RequestRecord
from observe.stats import WallClock
from serving.guard.verdicts import Admitted, Refusal
from serving.engine.failures import (
    ENGINE_DEAD,
    ENGINE_HUNG,
    ENGINE_SHUTDOWN,
    EngineFailure,
    engine_failure,
    engine_hang_s,
    is_engine_dead,
)
from serving.engine.load import PrefillEnd
from serving.engine.outputs import (
    EngineRequest,
    absorb,
    is_delta,
    next_watch,
    prompt_length,
    watched_collector,
)
from serving.engine.processes import alive, engine_processes, kill_all, wait_gone
from serving.engine.step_receiver import StepLedger

log = logging.getLogger("tailguard")

REAP_WAIT_S = 5.0  # how long a shut-down engine's processes get before SIGKILL

# The request being served on this task: set by the HTTP layer, read by generate().
# A context variable because vLLM's serving handlers call `generate(prompt, params,
# request_id, ...)` with no room for our record; this is the only place it lives.
current_request: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "tailguard_request", default=None)


class ObservedEngine:
    """Delegates to an `AsyncLLM`; `generate()` also fills the current request's
    record: token counts, finish reason, first-token time and the engine's stamps."""

    def __init__(self, engine, ledger: StepLedger, clock: WallClock, admission=None,
                 hang_s: float | None = None, on_failure: Callable[[], None] | None = None):
        # imported here, once: vLLM loads with an engine, not with this module (a
        # `serve` that refuses its arguments must not wait for vLLM)
        from vllm.v1.engine import async_llm

        if not getattr(async_llm.RequestOutputCollector, "watched", False):
            async_llm.RequestOutputCollector = watched_collector(
                async_llm.RequestOutputCollector)
        self._engine = engine
        self._ledger = ledger
        ledger.drain_before(getattr(engine, "output_processor", None))
        self._clock = clock
        self._admission = admission
        self.hang_s = engine_hang_s() if hang_s is None else hang_s
        self.fault: str | None = None  # ENGINE_DEAD / ENGINE_HUNG once it failed
        self._on_failure = on_failure  # the guard's wake-up: breaker L2 acts at once
        self.in_flight = 0  # engine requests between submission and their last output
        self.progress_at = time.monotonic()
        self._steps_seen = ledger.steps_seen
        self._processes = engine_processes(engine)
        self._live: dict[str, set[EngineRequest]] = {}  # HTTP request id -> its own
        # HTTP request id -> why its engine requests were cut short (until `outcome()`)
        self._outcomes: dict[str, Refusal | EngineFailure] = {}
        # vLLM's priority scheduling (tailguard's default): admission's priority (lane,
        # then deadline) orders the engine's waiting queue and picks who is preempted.
        scheduler = getattr(getattr(engine, "vllm_config", None), "scheduler_config", None)
        self.priority_lanes = getattr(scheduler, "policy", "fcfs") == "priority"

    def __getattr__(self, name):
        return getattr(self._engine, name)

    # --- failure: what breaker L2 watches, the watchdog, clean-up ------------------

    @property
    def errored(self) -> bool:
        return self.fault == ENGINE_HUNG or bool(getattr(self._engine, "errored", False))

    def watchdog(self, now: float | None = None) -> bool:
        """Called about once a second. Requests unfinished in the engine and no
        progress (an engine step, or an output) for `hang_s`: the engine is hung, so
        kill its processes, fail the requests in flight (`EngineDeadError`, as for a
        crash) and report `errored`. True when the engine is (now) known hung.

        Unfinished in the engine, not merely open here: a stream whose client reads
        slowly keeps its request open after the engine is done with it."""
        now = time.monotonic() if now is None else now
        if self.fault is not None:
            return self.fault == ENGINE_HUNG
        steps, pending = self._ledger.steps_seen, self._unfinished()
        if steps != self._steps_seen or pending == 0:
            self._steps_seen, self.progress_at = steps, now
            return False
        stalled = now - self.progress_at
        if self.hang_s <= 0 or stalled < self.hang_s:
            return False
        self.fault = ENGINE_HUNG
        log.error("engine hung: %d request(s) unfinished and no engine progress for %.1f s; "
                  "killing the engine core", pending, stalled)
        self.kill("engine hung")
        self._fail_in_flight()  # vLLM would notice the death too, but not at once
        return True

    def _unfinished(self) -> int:
        """Requests the engine still owes output (vLLM's count; ours without it)."""
        count = getattr(self._engine, "get_num_unfinished_requests", None)
        try:
            return int(count()) if callable(count) else self.in_flight
        except Exception:
            return self.in_flight

    def kill(self, why: str = "killed on request") -> None:
        """SIGKILL the engine core and its workers (a stopped process dies too)."""
        kill_all(self._live_processes(), why)

    def shutdown(self, *args, **kwargs) -> None:
        """vLLM's shutdown, then fail the requests still in flight (vLLM's shutdown
        cancels its output handler, which would leave them waiting forever) and make
        sure no engine process outlives it (an orphaned worker, a stopped core).

        A failed engine has nothing left to finish: what remains of it (the worker of
        a crashed core, say, which took a second to notice) is killed first, so
        vLLM's shutdown and the reaping below wait for nothing but exits."""
        failed = self.errored
        if self.fault is None and self.in_flight:
            self.fault = ENGINE_DEAD if failed else ENGINE_SHUTDOWN
        if failed:
            self.kill("the engine failed")
        try:
            self._engine.shutdown(*args, **kwargs)
        finally:
            self._fail_in_flight()
            survivors = wait_gone(self._live_processes(), REAP_WAIT_S)
            kill_all(survivors, "it outlived shutdown")
            wait_gone(survivors, REAP_WAIT_S)

    def _fail_in_flight(self) -> None:
        """Every engine request still waiting for output gets `EngineDeadError`."""
        processor = getattr(self._engine, "output_processor", None)
        if processor is None:
            return
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            processor.propagate_error(EngineDeadError())
        except Exception:  # shutting down: best effort
            log.exception("could not fail the engine requests in flight")

    def _live_processes(self) -> list:
        found = {p.pid: p for p in self._processes}
        for proc in self._processes:  # a worker started since counts too
            try:
                found.update((c.pid, c) for c in proc.children(recursive=True))
            except psutil.Error:
                pass
        return [p for p in found.values() if alive(p)]

    def request_failed(self, rec: RequestRecord, exc: BaseException) -> None:
        """An engine request ended in `exc`: if the engine itself failed, the request
        ends with the failure (not a generic 500)."""
        if self.fault is None and (is_engine_dead(exc) or self.errored):
            self.fault = ENGINE_DEAD
        if self.fault is not None:
            self._outcomes.setdefault(rec.request_id, engine_failure(self.fault, self.hang_s))
            if self._on_failure is not None:
                self._on_failure()

    def outcome(self, owner: str) -> Refusal | EngineFailure | None:
        """Why HTTP request `owner`'s engine requests were cut short, once: admission
        refused one, or the engine failed under it. None: vLLM's own answer stands."""
        return self._outcomes.pop(owner, None)

    async def generate(self, prompt, sampling_params, request_id: str,
                       *args, **kwargs) -> AsyncIterator:
        """vLLM's `generate()`, admitted first, its outputs seen as the engine hands
        them over (`EngineRequest`): the request's engine slot is given back when the
        engine is done with it, however slowly (or never) the client reads its
        stream."""
        rec = current_request.get()
        if rec is None:
            async for out in self._engine.generate(prompt, sampling_params, request_id,
                                                   *args, **kwargs):
                yield out
            return
        rec.max_tokens = getattr(sampling_params, "max_tokens", rec.max_tokens)
        prompt_tokens = prompt_length(prompt)
        if self._admission is not None:  # may wait for a slot, truncate, or refuse
            verdict = await self._admission.admit(rec, prompt, prompt_tokens, rec.max_tokens)
            if not isinstance(verdict, Admitted):
                self._outcomes[rec.request_id] = verdict
                raise NotAdmitted(verdict.message)
            prompt, prompt_tokens = verdict.prompt, verdict.prompt_tokens
            if self.priority_lanes:
                kwargs["priority"] = verdict.priority
        watch = self._track(rec, request_id, prompt_tokens, is_delta(sampling_params),
                            kwargs.get("priority", 0))
        outputs = self._engine.generate(prompt, sampling_params, request_id, *args,
                                        **kwargs)
        next_watch.set(watch)  # taken by the collector vLLM makes for it
        try:
            async for out in outputs:
                if watch.internal_id is None:  # no vLLM collector took it (a test's engine)
                    watch.seen(out)
                yield out
        except Exception as exc:
            if not watch.failed:  # a failure its collector was given is known already
                self.request_failed(rec, exc)
            raise
        finally:
            next_watch.set(None)
            try:
                await outputs.aclose()  # a reader gone early: vLLM aborts it here
            finally:
                watch.end()  # never submitted, or no last output came

    def _track(self, rec: RequestRecord, request_id: str, prompt_tokens: int,
               deltas: bool, priority: int) -> EngineRequest:
        """Engine request `request_id` of `rec` is about to be submitted."""
        admission = self._admission
        prefill = PrefillEnd(admission, prompt_tokens, asyncio.get_running_loop(), priority)
        if admission is None:
            self._ledger.track(request_id, rec.tally, rec.request_id)
        else:
            self._ledger.track(request_id, rec.tally, rec.request_id,
                               prefill.from_any_thread, prefill.chunk_from_any_thread)
        if self.in_flight == 0:
            self.progress_at = time.monotonic()  # the watchdog's clock starts now
        self.in_flight += 1
        watch = EngineRequest(self, rec, request_id, prefill, deltas)
        self._live.setdefault(rec.request_id, set()).add(watch)
        return watch

    def request_ended(self, watch: EngineRequest) -> None:
        """An engine request ended (finished, aborted or failed): free its slot,
        untrack its steps and add its outcome to the record."""
        self.in_flight -= 1
        watch.prefill.release(watch.tokens)
        self._ledger.untrack(watch.request_id)  # drains: every step of it is in
        if watch.last is not None:
            absorb(watch.rec, watch.last, watch.tokens, self._clock)
        owner = watch.rec.request_id
        live = self._live.get(owner)
        if live is not None:
            live.discard(watch)
            if not live:
                del self._live[owner]

    async def settle(self, owner: str, timeout_s: float = 5.0) -> None:
        """End every engine request of HTTP request `owner` that still runs (its client
        left) and wait for their clean-up, so its record is complete before it is
        finished. vLLM closes a multi-prompt request's generators without waiting."""
        live = [w for w in self._live.pop(owner, ()) if not w.done]
        submitted = [w.internal_id for w in live if w.internal_id is not None]
        if submitted:
            with contextlib.suppress(Exception):  # a dead engine has failed them already
                await self._engine.abort(submitted, internal=True)
        waits = [w.ended() for w in live if not w.done]
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)
        self._outcomes.pop(owner, None)  # its answer is given: nobody is left to ask


class NotAdmitted(Exception):
    """Raised into vLLM's call path when admission refuses an engine request: it ends
    vLLM's handling, and the HTTP layer answers with the refusal (`outcome()`)."""
