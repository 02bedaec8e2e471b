"""The engine's load as the server sees it, live: what admission decisions and the
latency predictor read when a request arrives.

The engine's own counts (waiting, running, KV-cache usage) arrive with each step
through the stat logger; the server's counts (requests admitted that have no first
token yet, and their prompt tokens) change with every request, so a burst is visible
before the engine has taken a single step of it; `PrefillEnd` takes each prompt off
them as the step probe sees the engine prefill it.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from typing import Protocol

from observe.record import AdmissionLoad
from observe.stats import StepRecord
from serving.engine.stats import EngineSecond
from slo.sim.engine_model import attention_pairs


class PrefillListener(Protocol):
    """What `PrefillEnd` tells (`serving.admission.Admission`)."""

    def entered(self, prefill: PrefillEnd) -> None: ...
    def left(self, prefill: PrefillEnd) -> None: ...
    def prefill_progress(self, tokens: int, computed: int) -> None: ...
    def first_token(self, prompt_tokens: int, computed: int = 0) -> None: ...
    def release(self, pending_tokens: int | None, computed: int = 0,
                kv_tokens: int = 0) -> None: ...

STEP_EWMA_ALPHA = 0.2  # weight of the newest step: about the last ten steps matter


class LoadTracker:
    def __init__(self, second: EngineSecond):
        self._second = second
        self._lock = threading.Lock()
        self._pending = 0
        self._pending_tokens = 0
        self._pending_pairs = 0
        self.recent_step_s = 0.0
        self.recent_step_tokens = 0.0  # the same average of the tokens a step computes
        self.in_engine: set[PrefillEnd] = set()  # every prompt the engine holds (the loop's)

    def on_step(self, step: StepRecord) -> None:
        """Ledger consumer, run as the step is drained (under the ledger's lock): a
        moving average of step time."""
        alpha = STEP_EWMA_ALPHA if self.recent_step_s else 1.0
        self.recent_step_s += alpha * (step.duration_s - self.recent_step_s)
        self.recent_step_tokens += alpha * (step.scheduled_tokens - self.recent_step_tokens)

    @property
    def kv_use_rate(self) -> float:
        """KV-cache tokens the engine takes a second while it steps (each token it
        computes holds a slot)."""
        return self.recent_step_tokens / self.recent_step_s if self.recent_step_s else 0.0

    @property
    def kv_cache_usage(self) -> float:
        """The engine's KV-cache usage (0-1) in its latest statistics."""
        return self._second.kv_cache_usage

    def admit(self, prompt_tokens: int) -> AdmissionLoad:
        """The load just before this request joins it; it is pending from now on."""
        second = self._second
        with self._lock:
            load = AdmissionLoad(second.waiting, second.running, second.kv_cache_usage,
                                 self.recent_step_s, self._pending, self._pending_tokens,
                                 self._pending_pairs)
            self._pending += 1
            self._pending_tokens += prompt_tokens
            self._pending_pairs += attention_pairs(0, prompt_tokens)
        return load

    def progress(self, tokens: int, computed: int) -> None:
        """A chunk of `tokens` of a pending prompt, `computed` of it before the chunk, is
        prefilled: that much less work ahead."""
        with self._lock:
            self._pending_tokens -= tokens
            self._pending_pairs -= attention_pairs(computed, tokens)

    def release(self, prompt_tokens: int, computed: int = 0) -> None:
        """The request's prefill is done (or it left): no longer work ahead of newcomers;
        `prompt_tokens`: what was left of its prompt after `computed` of it was
        prefilled (by `progress`)."""
        with self._lock:
            self._pending -= 1
            self._pending_tokens -= prompt_tokens
            self._pending_pairs -= attention_pairs(computed, prompt_tokens)

    def preemptable_by(self, priority: int | None) -> int:
        """KV-cache tokens the engine's next preemption frees for a waiting request with
        engine `priority` (None: none counted). vLLM preempts one running request at a
        time when a running one finds no free block: the one due last (largest
        priority, the newest among equals), and no other until that room is used up;
        none counts if the victim is due before the request (it takes its room back
        first). Its prompt only: a request's output (16-128 tokens here) is small
        beside its prompt."""
        running = [p for p in self.in_engine if not p.waiting]
        if priority is None or not running:
            return 0
        victim = max(running, key=lambda p: (p.priority, p.entered_at))
        return victim.kv_tokens if victim.priority > priority else 0

    @property
    def pending(self) -> tuple[int, int]:
        return self._pending, self._pending_tokens

    @property
    def pending_pairs(self) -> int:
        """The attention pairs left of the pending prompts."""
        return self._pending_pairs


class PrefillEnd:
    """Tells admission how far a request's prompt is prefilled: that it entered the
    engine (with its engine `priority`), each chunk (from the step probe, on the
    ledger's thread; the first one: vLLM has started it) and its end once, from the
    probe or its first output (streamed ones), whichever comes first; never after the
    request has ended."""

    __slots__ = ("admission", "prompt", "left", "loop", "pending", "priority", "waiting",
                 "entered_at")

    def __init__(self, admission: PrefillListener | None, prompt_tokens: int,
                 loop: asyncio.AbstractEventLoop, priority: int = 0):
        self.admission, self.prompt, self.left, self.loop = \
            admission, prompt_tokens, prompt_tokens, loop
        self.pending = admission is not None
        self.priority = priority
        self.waiting = self.pending and prompt_tokens > 0  # in vLLM's waiting queue
        self.entered_at = time.monotonic()  # sent to the engine
        if self.pending:
            admission.entered(self)

    def _started(self) -> None:
        self.waiting = False

    @property
    def kv_tokens(self) -> int:
        """Its prompt tokens in the KV cache: those prefilled, all once it has its
        first token."""
        return self.computed if self.pending else self.prompt

    @property
    def computed(self) -> int:
        """Prompt tokens prefilled so far (by the chunks seen)."""
        return self.prompt - self.left

    def from_any_thread(self) -> None:
        self.loop.call_soon_threadsafe(self.ended)

    def chunk_from_any_thread(self, tokens: int) -> None:
        self.loop.call_soon_threadsafe(self.chunk, tokens)

    def chunk(self, tokens: int) -> None:
        done = min(tokens, self.left)
        self._started()
        if self.pending and done > 0:
            self.admission.prefill_progress(done, self.computed)
            self.left -= done

    def ended(self) -> None:
        self._started()
        if self.pending:
            self.pending = False
            self.admission.first_token(self.left, self.computed)

    def close(self) -> int | None:
        """The request ended; returns what was left of its prompt if it was still
        pending, else None."""
        self._started()
        pending, self.pending = self.pending, False
        return self.left if pending else None

    def release(self, generated: int = 0) -> None:
        """The request ended, having generated `generated` tokens: admission gets its
        slot back and the KV cache it held, and what was left of its prompt (with the
        attention pairs of the part left) is no longer work ahead."""
        if self.admission is not None:
            self.admission.left(self)
            computed = self.computed
            left = self.close()
            # with a first token its whole prompt was in the KV cache, whether or not
            # the probe's chunk reports came before the output did
            held = self.prompt if left is None else computed
            self.admission.release(left, computed, held + generated)


class ResidentBytes:
    """RSS of a process and its children (the engine core runs in a child), read once a
    second. Finding the children scans every process on the machine (/proc/*/stat), so
    the list is kept for `refresh_s` (and found again at once when one has exited: an
    engine restart); reading each one's RSS is a small file read."""

    __slots__ = ("_pid", "_refresh_s", "_procs", "_found_at")

    def __init__(self, pid: int | None = None, refresh_s: float = 30.0):
        self._pid = pid or os.getpid()
        self._refresh_s = refresh_s
        self._procs: list = []
        self._found_at = -math.inf

    def __call__(self) -> int | None:
        try:
            import psutil
        except ImportError:
            return None
        now = time.monotonic()
        if now - self._found_at >= self._refresh_s or not self._procs:
            try:
                proc = psutil.Process(self._pid)
                self._procs = [proc, *proc.children(recursive=True)]
            except (psutil.Error, OSError):
                return None
            self._found_at = now
        total = 0
        for p in self._procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a child that exited: find them again next time
                self._found_at = -math.inf
        return total
