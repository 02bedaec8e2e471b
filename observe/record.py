"""One request's record: what the server observed of it from arrival to its last
byte (`RequestRecord`), with the load and the latency prediction it met at admission.
Observations only; spans, metrics, the trace log and the SLO engine each consume a
finished record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from observe.registry import (
    BATCH_BUCKET_BOUNDS,
    PRIORITY_REALTIME,
    STATUS_OK,
    batch_bucket,
    context_bucket,
)
from observe.stats import EngineTimes, SamplingTally, WallClock


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
    # their attention pairs left (`slo.sim.engine_model.attention_pairs`): what makes the
    # rest of a half-prefilled document dearer than as many tokens of a fresh prompt
    pending_prefill_pairs: int = 0


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
    # TTFT from arrival as the engine model estimated it at admission (deadline check;
    # unscaled by any slowdown): what breaker L1's off-model sign compares against.
    ttft_estimate_s: float | None = None
    # The same estimate without the verdict's allowance for VIP work still to come (it
    # counts VIPs over the whole time left, on purpose too many): the latency
    # prediction's input, and what its calibration learns from.
    ttft_expected_s: float | None = None
    # Its engine part (from arrival: the check's time plus the steps it estimated), for
    # a request judged with nothing ahead of it: its TTFT less this is the overhead
    # after the check that the live engine model learns (`LiveEngineModel.on_request`).
    engine_ttft_s: float | None = None
    queued_at: float | None = None  # monotonic, admission began (before any slot wait)
    # Seconds it waited in front of the engine (the limiter: a slot, the prefill gate,
    # a promise kept to a prompt due earlier): the part of queue_s that is tailguard's
    admission_wait_s: float | None = None
    vip: bool = False  # the API key's VIP flag: admitted under VIP-only
    client: str | None = None  # the API key's name, `anonymous` without keys; None: unknown
    # Seed 000's length-class boundaries in force at admission (None: never admitted)
    length_bounds: tuple[int, int] | None = None

    @property
    def context_bucket(self) -> str:
        return context_bucket(self.prompt_tokens)

    @property
    def batch_bucket(self) -> str:
        return batch_bucket(self.prompt_tokens, self.length_bounds or BATCH_BUCKET_BOUNDS)

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
            "tokenize_s": self.tokenize_s, "vip": self.vip, "client": self.client,
            "estimated_ttft_s": self.ttft_estimate_s, "admission_wait_s": self.admission_wait_s,
            "length_class_low": self.length_bounds and self.length_bounds[0],
            "length_class_high": self.length_bounds and self.length_bounds[1],
            **_load_columns(self.load), **_prediction_columns(self.prediction),
        }
