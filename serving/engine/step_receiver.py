"""Server side of the engine-step probe: receives step datagrams, credits each step's
sampler time to the requests it carried, and hands every step to its consumers
(`llm.step` spans, the engine-stats second).

Ordering guarantee we rely on: the probe sends a step's datagram before the engine
core ships that step's outputs, and a Unix datagram lands in our socket buffer at
`sendto` time. So when the final output of a request reaches the server, `drain()`
on the caller's thread is certain to see every step of that request.

Who drains: the event loop, as it takes each batch of the engine's outputs (it wakes
for them anyway, and the prompt hooks then fire before the outputs are read), and the
ledger's thread, which sleeps on the socket while no step comes and, once steps come,
wakes once a hold to drain what the loop left and run the consumers. Each wake-up of
the thread is a GIL hand-over from a busy event loop: 0.3 ms of CPU on this project's
2-vCPU machine whatever the wake-up then does (`bench/server_cpu/ledger_cost.py`). So
the hold follows the engine's pace: `HOLD_STEPS` step times (a running average of the
steps' own durations, so an idle gap between steps does not stretch it), between
`hold_s` and `max_hold_s`. The socket queues only 10 datagrams (Linux's
`net.unix.max_dgram_qlen`): a hold of three step times leaves room for ten steps that
no output batch drains (a long prompt's chunks), and the loop's drain per output batch
keeps the queue short otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from observe import settings
from observe.settings import TAILGUARD_STEP_SOCKET
from observe.stats import SamplingTally, StepRecord

log = logging.getLogger(__name__)
INTERNAL_SUFFIX_LEN = 9  # vLLM makes internal ids as f"{external}-{uuid8}"
HOLD_STEPS = 3.0  # a hold, in step times: well under the socket's 10 datagrams
PACE_WEIGHT = 0.2  # of the newest step's time in the running average


def external_id(internal: str) -> str:
    return internal[:-INTERNAL_SUFFIX_LEN] if len(internal) > INTERNAL_SUFFIX_LEN else internal


@dataclass(frozen=True, slots=True)
class _Tracked:
    """One engine request's tally, owner and prompt hooks."""
    tally: SamplingTally
    owner: str
    on_prefilled: Callable[[], None] | None = None
    on_chunk: Callable[[int], None] | None = None


def _consume(consumers: list[Callable[[StepRecord], None]], record: StepRecord) -> None:
    for consumer in consumers:
        try:
            consumer(record)
        except Exception:  # a broken consumer must not stop step accounting
            log.exception("step consumer failed")


def _call_hook(hook: Callable, *args) -> None:
    try:
        hook(*args)
    except Exception:  # a broken hook must not stop step accounting
        log.exception("prefill hook failed")


class StepLedger:
    """Owns the receiving socket and the per-request sampling tallies."""

    def __init__(self, consumers: list[Callable[[StepRecord], None]] | None = None,
                 poll_s: float = 1.0, hold_s: float = 0.015,
                 at_once: list[Callable[[StepRecord], None]] | None = None,
                 max_hold_s: float = 0.25):
        self._dir = tempfile.mkdtemp(prefix="tailguard-steps-")
        self.path = os.path.join(self._dir, "steps.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.setblocking(False)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self._tallies: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._consumers = list(consumers or [])
        # Cheap consumers that admission reads (the step time, the last step's end):
        # run as each step is drained, on the loop before its outputs as often as not,
        # so the deadline check never judges with a step up to a hold old.
        self._at_once = list(at_once or [])
        self._poll_s, self._hold_s, self._max_hold_s = poll_s, hold_s, max(hold_s, max_hold_s)
        self._step_s: float | None = None  # running average of the steps' times
        self._closed = threading.Event()
        self.steps_seen = 0
        # Steps the probe numbered but we never got: dropped at a full socket (the
        # engine counts them, in its own process) or torn. Seen as gaps in the index.
        self.steps_lost = 0
        self._last_index = 0
        self.wakeups = 0  # the thread's, for the benchmark and tests
        self._unpublished: deque[StepRecord] = deque()
        # True while steps come: the thread then wakes on its timer, not on the socket.
        # Steps drained on another thread while it sleeps on the socket wake it once.
        self._active = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._run, name="tailguard-steps", daemon=True)

    def start(self) -> "StepLedger":
        """Export the socket path to the engine processes, then start polling."""
        settings.export(TAILGUARD_STEP_SOCKET, self.path)
        self._thread.start()
        return self

    def add_consumer(self, consumer: Callable[[StepRecord], None]) -> None:
        self._consumers.append(consumer)

    def track(self, engine_id: str, tally: SamplingTally | None = None,
              owner: str | None = None, on_prefilled: Callable[[], None] | None = None,
              on_chunk: Callable[[int], None] | None = None) -> SamplingTally:
        """Credit the steps of engine request `engine_id` to `tally` from now on, and
        name it `owner` (the HTTP request id) in published steps. On whichever thread
        drains: `on_prefilled()` when a step finishes its prompt, `on_chunk(tokens)`
        when a step prefills part of it."""
        tally = tally if tally is not None else SamplingTally()
        with self._lock:
            self._tallies[engine_id] = _Tracked(tally, owner or engine_id, on_prefilled,
                                                on_chunk)
        return tally

    def untrack(self, request_id: str) -> None:
        self.drain()
        with self._lock:
            self._tallies.pop(request_id, None)

    def drain_before(self, processor) -> None:
        """Drain as the event loop hands each batch of engine outputs to `processor`
        (vLLM's `OutputProcessor`), before any of them is read: a prompt's end is then
        known when its first output is, streamed or not. None: nothing to wrap."""
        process_outputs = getattr(processor, "process_outputs", None)
        if process_outputs is None:
            return

        def drained_first(*args, **kwargs):
            self.drain()
            return process_outputs(*args, **kwargs)

        processor.process_outputs = drained_first

    def drain(self) -> int:
        """Apply every datagram already received; returns how many."""
        count, wake = 0, False
        with self._lock:
            while True:
                try:
                    data = self._sock.recv(1 << 20)
                except (BlockingIOError, OSError):
                    break
                record = self._apply(data)
                if record is not None:
                    self._unpublished.append(record)
                    count += 1
                    _consume(self._at_once, record)
            if count and not self._active:
                self._active = wake = True
        if wake and threading.current_thread() is not self._thread:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:  # the pipe is full: the thread is waking anyway
                pass
        return count

    def _apply(self, data: bytes) -> StepRecord | None:
        try:
            index, start, forward_s, sampling_s, tokens, internal_ids, ends, chunks, pairs = \
                json.loads(data)
        except ValueError:
            return None
        owners = []
        for engine_id in map(external_id, internal_ids):
            tracked = self._tallies.get(engine_id)
            if tracked is not None:
                tracked.tally.add(start, forward_s + sampling_s, sampling_s)
            owners.append(engine_id if tracked is None else tracked.owner)
        for internal, done in chunks:
            tracked = self._tallies.get(external_id(internal))
            if tracked is not None and tracked.on_chunk is not None:
                _call_hook(tracked.on_chunk, done)
        for engine_id in map(external_id, ends):
            tracked = self._tallies.get(engine_id)
            if tracked is not None and tracked.on_prefilled is not None:
                _call_hook(tracked.on_prefilled)
        self.steps_seen += 1
        self._pace(forward_s + sampling_s)
        if index > self._last_index + 1 and self._last_index:
            self.steps_lost += index - self._last_index - 1
        self._last_index = index  # lower: a new engine process numbers from 1 again
        return StepRecord(index, start, forward_s, sampling_s, tokens, tuple(owners), pairs)

    def _pace(self, step_s: float) -> None:
        average = self._step_s
        self._step_s = step_s if average is None else average + PACE_WEIGHT * (step_s - average)

    def hold(self) -> float:
        """How long the thread sleeps between drains while steps come."""
        if self._step_s is None:
            return self._hold_s
        return min(self._max_hold_s, max(self._hold_s, HOLD_STEPS * self._step_s))

    def describe(self) -> dict:
        """What `/admin/policies` shows of the probe: steps received and lost, and how
        often the ledger's thread woke for them."""
        return {"steps_seen": self.steps_seen, "steps_lost": self.steps_lost,
                "thread_wakeups": self.wakeups, "hold_s": round(self.hold(), 4)}

    def publish(self) -> int:
        """Every step received so far to its consumers now, on the caller's thread (a
        reader that wants them all: `/admin/flush`, off the event loop)."""
        self.drain()
        return self._publish()

    def _publish(self) -> int:
        """Consumers (spans, engine stats) run on the ledger's thread, never on the
        event loop that may have drained the record; returns how many records."""
        count = 0
        with self._publish_lock:  # one publisher at a time: steps reach them in order
            while self._unpublished:
                _consume(self._consumers, self._unpublished.popleft())
                count += 1
        return count

    def _run(self) -> None:
        while not self._closed.is_set():
            if self._active:
                self._closed.wait(self.hold())
            elif not self._sleep_on_socket():
                return
            self.wakeups += 1
            self.drain()
            if self._publish():
                continue
            with self._lock:  # a quiet hold: back to the socket, unless a drain came
                self._active = bool(self._unpublished)

    def _sleep_on_socket(self) -> bool:
        try:
            ready, _, _ = select.select([self._sock, self._wake_r], [], [], self._poll_s)
        except (OSError, ValueError):
            return False
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        return True

    def close(self) -> None:
        self._closed.set()
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.drain()  # may write to the wake pipe: close it only after
        self._publish()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._sock.close()
        settings.withdraw(TAILGUARD_STEP_SOCKET, self.path)
        for path in (self.path, self._dir):
            try:
                os.remove(path) if path == self.path else os.rmdir(path)
            except OSError:
                pass


class NoStepLedger:
    """The in-memory twin of `StepLedger` for an engine without the step probe (fakes
    in tests and benchmarks): it tracks nothing and never sees a step."""

    steps_seen = steps_lost = 0

    def track(self, *args, **kwargs) -> None:
        pass

    def untrack(self, *args) -> None:
        pass

    def drain_before(self, processor) -> None:
        pass
