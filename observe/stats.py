"""Plain request-timing records. No exporter imports here: spans, metrics, the
trace log and the SLO engine each consume a finished `RequestRecord`.

Clocks: vLLM stamps engine-core events with `time.monotonic()` (system-wide
CLOCK_MONOTONIC, so comparable across the engine's processes on one host) and the
request's arrival with `time.time()`. We keep everything monotonic and convert
to wall time once, at the edges, with `WallClock`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from observe.registry import PRIORITY_REALTIME, STATUS_OK, batch_bucket, context_bucket


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
class AdmissionLoad:
    """The engine's load as the server saw it when a request was admitted: what the
    latency predictor knows besides the request's own shape, kept on the row so a
    model can be trained (and its accuracy judged) from the trace log alone."""

    queue_depth: int  # the engine's waiting requests
    running_requests: int
    kv_cache_usage: float
    recent_step_s: float  # moving average of engine step time
    pending_requests: int  # admitted before this one, no first token yet
    pending_prefill_tokens: int  # their prompt tokens: prefill work ahead of this one


@dataclass(frozen=True, slots=True)
class LatencyPrediction:
    """A request's latency as predicted at admission (seconds)."""

    ttft_s: float
    ttft_p90_s: float
    tpot_s: float
    tpot_p90_s: float
    e2e_s: float  # for its max_tokens
    version: str  # which model: a trained model's id, or the seed formula


_NO_LOAD: dict = dict.fromkeys(AdmissionLoad.__slots__)
_NO_PREDICTION: dict = {f"predicted_{name}" if name != "version" else "predictor_version": None
                        for name in LatencyPrediction.__slots__}


def _load_columns(load: AdmissionLoad | None) -> dict:
    return _NO_LOAD if load is None else {n: getattr(load, n) for n in AdmissionLoad.__slots__}


def _prediction_columns(pred: LatencyPrediction | None) -> dict:
    if pred is None:
        return _NO_PREDICTION
    return {"predicted_ttft_s": pred.ttft_s, "predicted_ttft_p90_s": pred.ttft_p90_s,
            "predicted_tpot_s": pred.tpot_s, "predicted_tpot_p90_s": pred.tpot_p90_s,
            "predicted_e2e_s": pred.e2e_s, "predictor_version": pred.version}


@dataclass(slots=True)
class RequestRecord:
    """One request's whole trajectory: a row of `requests`, the source of its spans
    and metrics. Filled in as the request moves; `finish()` fixes the derived times."""

    request_id: str
    arrival: float  # monotonic, when the HTTP request arrived
    endpoint: str
    model: str = ""
    stream: bool = False
    priority: str = PRIORITY_REALTIME
    trace_id: str = ""
    status: str = STATUS_OK
    http_status: int = 200
    error_type: str | None = None
    error_message: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    max_tokens: int | None = None
    engine: EngineTimes | None = None
    # monotonic, the first output with tokens reached the server; a non-streamed
    # request's only output is its last (vLLM FINAL_ONLY): TTFT reads `first_token_at`
    first_token: float | None = None
    end: float | None = None  # monotonic, response finished
    tally: SamplingTally = field(default_factory=SamplingTally)
    slo_ttft_target_s: float | None = None
    slo_ok: bool | None = None
    policy_actions: list[str] = field(default_factory=list)
    load: AdmissionLoad | None = None
    prediction: LatencyPrediction | None = None
    queued_at: float | None = None  # monotonic, admission began (before any slot wait)
    vip: bool = False  # the API key's VIP flag: admitted under VIP-only
    refusal: Exception | None = None  # set when admission refused it inside vLLM's path

    @property
    def context_bucket(self) -> str:
        return context_bucket(self.prompt_tokens)

    @property
    def batch_bucket(self) -> str:
        return batch_bucket(self.prompt_tokens)

    @property
    def e2e_s(self) -> float | None:
        return None if self.end is None else self.end - self.arrival

    @property
    def tokenize_s(self) -> float | None:
        """HTTP arrival -> the engine accepts it: body parsing, chat template, tokenizing."""
        if self.engine is None or self.engine.accepted is None:
            return None
        return max(0.0, self.engine.accepted - self.arrival)

    @property
    def first_token_at(self) -> float | None:
        """When the first token was made, as TTFT counts it (monotonic): the engine's
        output carrying it reached the engine client in this process (vLLM's own TTFT
        end point; the earliest over a request's engine requests). From the engine's
        stats, so a non-streamed request is not timed at its end; what the server saw
        when the stats lack it."""
        seen = None if self.engine is None else self.engine.first_token_seen
        return self.first_token if seen is None else seen

    @property
    def ttft_s(self) -> float | None:
        """HTTP arrival -> `first_token_at`: the pre-engine time plus vLLM's TTFT."""
        at = self.first_token_at
        return None if at is None else max(0.0, at - self.arrival)

    @property
    def tpot_s(self) -> float | None:
        """Decode time per token after the first, the usual TPOT definition."""
        if self.engine is None or self.output_tokens < 2:
            return None
        return self.engine.decode_s / (self.output_tokens - 1)

    @property
    def avg_iter_s(self) -> float | None:
        return self.tally.step_s / self.tally.steps if self.tally.steps else None

    def fail(self, http_status: int, error_type: str, message: str, status: str) -> None:
        self.http_status, self.error_type, self.error_message = http_status, error_type, message
        self.status = status

    def row(self, clock: WallClock) -> dict:
        """The `requests` row, column names as in CONTRACT.md."""
        engine = self.engine
        return {
            "request_id": self.request_id, "trace_id": self.trace_id,
            "arrival_ts": clock.datetime(self.arrival), "model": self.model,
            "endpoint": self.endpoint, "stream": self.stream, "priority": self.priority,
            "status": self.status, "http_status": self.http_status,
            "error_type": self.error_type, "error_message": self.error_message,
            "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "max_tokens": self.max_tokens,
            "context_bucket": self.context_bucket, "batch_bucket": self.batch_bucket,
            "queue_s": engine and engine.queue_s, "prefill_s": engine and engine.prefill_s,
            "decode_s": engine and engine.decode_s,
            "sampling_s": self.tally.sampling_s if self.tally.steps else None,
            "ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
            "iterations": self.tally.steps, "avg_iter_s": self.avg_iter_s,
            "preemptions": engine.preemptions if engine else 0,
            "slo_ttft_target_s": self.slo_ttft_target_s, "slo_ok": self.slo_ok,
            "policy_actions": list(self.policy_actions),
            "tokenize_s": self.tokenize_s, "vip": self.vip,
            **_load_columns(self.load), **_prediction_columns(self.prediction),
        }


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as the in-engine probe timed it (monotonic seconds)."""

    index: int
    start: float
    forward_s: float
    sampling_s: float
    scheduled_tokens: int
    request_ids: tuple[str, ...]  # HTTP request ids where known, else engine ids

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
