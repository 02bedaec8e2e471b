"""Plain engine-side timing records: the wall clock, the engine's own stamps for a
request, the step probe's tally, one engine step and one engine second. No exporter
imports here; the per-request record built from them is `observe.record`.

Clocks: vLLM stamps engine-core events with `time.monotonic()` (system-wide
CLOCK_MONOTONIC, so comparable across the engine's processes on one host) and the
request's arrival with `time.time()`. We keep everything monotonic and convert
to wall time once, at the edges, with `WallClock`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone


@dataclass(frozen=True, slots=True)
class WallClock:
    """Maps monotonic seconds to wall-clock time, fixed once per process."""

    offset: float = field(default_factory=lambda: time.time() - time.monotonic())

    def epoch(self, mono: float) -> float:
        return mono + self.offset

    def epoch_ns(self, mono: float) -> int:
        return int((mono + self.offset) * 1e9)

    def datetime(self, mono: float) -> datetime:
        return datetime.fromtimestamp(mono + self.offset, tz=timezone.utc)

    def monotonic(self, epoch: float) -> float:
        return epoch - self.offset


@dataclass(frozen=True, slots=True)
class EngineTimes:
    """The engine's own stamps for one request (vLLM RequestStateStats), monotonic."""

    queued: float  # the engine core took the request in
    scheduled: float
    first_token: float
    last_token: float
    preemptions: int = 0
    accepted: float | None = None  # the engine client (AsyncLLM) took the request in
    # The engine client (in this process) took in the engine output carrying the first
    # token: the end point of vLLM's own TTFT (`first_token_latency`). Streamed or not:
    # a non-streamed request's first output reaches its reader only at the end.
    first_token_seen: float | None = None

    @classmethod
    def from_vllm(cls, stats, clock: "WallClock | None" = None) -> "EngineTimes | None":
        """None when the engine never scheduled the request (aborted in the queue)."""
        if stats is None or not stats.queued_ts or not stats.scheduled_ts:
            return None
        first = stats.first_token_ts or stats.scheduled_ts
        last = stats.last_token_ts or first
        accepted = seen = None
        if clock is not None and stats.arrival_time:  # a wall-clock stamp of the frontend
            accepted = min(clock.monotonic(stats.arrival_time), stats.queued_ts)
            if stats.first_token_ts and stats.first_token_latency > 0:
                # vLLM: arrival_time -> its output processor's time.time() for the first
                # token; never before the engine core made it (a wall-clock step)
                seen = max(accepted + stats.first_token_latency, first)
        return cls(stats.queued_ts, stats.scheduled_ts, first, last, stats.num_preemptions,
                   accepted, seen)

    def merge(self, other: "EngineTimes") -> "EngineTimes":
        """Span of several engine requests serving one HTTP request."""
        return EngineTimes(min(self.queued, other.queued), min(self.scheduled, other.scheduled),
                           min(self.first_token, other.first_token),
                           max(self.last_token, other.last_token),
                           self.preemptions + other.preemptions,
                           _earliest(self.accepted, other.accepted),
                           _earliest(self.first_token_seen, other.first_token_seen))

    @property
    def queue_start(self) -> float:
        return self.queued if self.accepted is None else self.accepted

    # The intervals. Queue starts when the engine client accepts the request, not when
    # the engine core reads it (vLLM's `queued_ts`): the core only reads new requests
    # between steps, so a long step makes new requests wait before vLLM's queue clock
    # starts. That wait is queueing too, and it is where a P99 hides.
    @property
    def queue_s(self) -> float:  # accepted -> first scheduled
        return self.scheduled - self.queue_start

    @property
    def prefill_s(self) -> float:  # first scheduled -> first token
        return self.first_token - self.scheduled

    @property
    def decode_s(self) -> float:  # first token -> last token
        return self.last_token - self.first_token


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass(slots=True)
class SamplingTally:
    """What the engine-step probe saw of one request: steps and sampler time."""

    steps: int = 0
    sampling_s: float = 0.0
    step_s: float = 0.0
    first_sampling_start: float = 0.0  # monotonic; 0 until the first step

    def add(self, start: float, step_s: float, sampling_s: float) -> None:
        if not self.steps:
            self.first_sampling_start = start + step_s - sampling_s
        self.steps += 1
        self.step_s += step_s
        self.sampling_s += sampling_s


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as the in-engine probe timed it (monotonic seconds)."""

    index: int
    start: float
    forward_s: float
    sampling_s: float
    scheduled_tokens: int
    request_ids: tuple[str, ...]  # HTTP request ids where known, else engine ids
    attention_pairs: int = 0  # `slo.sim.engine_model.attention_pairs`, summed over the step

    @property
    def duration_s(self) -> float:
        return self.forward_s + self.sampling_s


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One second of the engine: an `engine_stats` row and the gauges."""

    ts: float  # monotonic
    running: int
    waiting: int
    kv_cache_usage: float
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    steps: int
    mean_batch_size: float
    max_batch_size: int
    mean_step_s: float | None
    mean_sampling_s: float | None
    finished: int
    rss_bytes: int | None = None  # resident memory of the server and its engine processes

    def row(self, clock: WallClock) -> dict:
        row = {name: getattr(self, name) for name in self.__slots__ if name != "ts"}
        row["ts"] = clock.datetime(self.ts)
        return row
