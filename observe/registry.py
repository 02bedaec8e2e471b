"""Every metric, label, span, attribute, bucket and recording-rule name tailguard uses, and
the thresholds its alerts and dashboards share, defined once (`tests/test_registry.py`): each
OTel name + unit renders the CONTRACT.md name exactly (`_seconds` for s, `_total` counters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

# --- context-length buckets (seed 003) -------------------------------------------
CONTEXT_BUCKET_BOUNDS: Final = (1024, 4096, 32768)
CONTEXT_BUCKETS: Final = ("0-1k", "1k-4k", "4k-32k", "32k+")

# --- batch buckets (seed 000): length classes, re-bucketed live (slo.policy.length_classes)
BATCH_BUCKET_BOUNDS: Final = (256, 512)

# --- label names of our metrics, and their fixed values --------------------------------
LABEL_CONTEXT_BUCKET: Final = "context_bucket"  # one of CONTEXT_BUCKETS
LABEL_STATUS: Final = "status"  # one of STATUSES
LABEL_PRIORITY: Final = "priority"  # one of PRIORITIES
LABEL_ERROR_TYPE: Final = "error_type"
LABEL_HTTP_STATUS: Final = "http_status"
LABEL_SLO: Final = "slo"  # an SLO's name in the spec
LABEL_RESULT: Final = "result"  # one of RESULTS
LABEL_POLICY: Final = "policy"
LABEL_HORIZON: Final = "horizon"
LABEL_TABLE: Final = "table"  # a trace-log table
LABEL_CLIENT: Final = "client"  # who called: slo.tenants.tenant_label (bounded)
LABEL_OUTCOME: Final = "outcome"  # one of slo.tenants.OUTCOMES
LABEL_BOUND: Final = "bound"  # "low" (short | medium) or "high" (medium | long)

PRIORITY_REALTIME: Final = "realtime"
PRIORITY_BATCH: Final = "batch"
PRIORITIES: Final = (PRIORITY_REALTIME, PRIORITY_BATCH)
STATUS_OK: Final = "ok"
STATUS_REJECTED: Final = "rejected"  # 4xx: the client's fault
STATUS_ERROR: Final = "error"  # 5xx: the engine or the server failed
STATUS_ABORTED: Final = "aborted"  # the client went away
STATUSES: Final = (STATUS_OK, STATUS_REJECTED, STATUS_ERROR, STATUS_ABORTED)
RESULT_GOOD: Final = "good"  # a request's verdict against one SLO (`..._slo_requests_total`)
RESULT_BAD: Final = "bad"
RESULTS: Final = (RESULT_GOOD, RESULT_BAD)


def _steps(start: float, stop: float, step: float) -> list[float]:
    return [round(start + i * step, 6) for i in range(round((stop - start) / step) + 1)]


# Latency bounds: 10 ms apart up to 2 s so that a P99 is resolved to 10 ms where the SLO
# targets live (200 ms - 2 s), then a coarse tail (vLLM's start at 0.3 s: too coarse).
LATENCY_BUCKETS_S: Final = tuple(
    [0.001, 0.0025, 0.005] + _steps(0.01, 2.0, 0.01) + [2.5, 3, 4, 5, 7.5, 10, 15, 20, 30, 60])
# Per-token times live in milliseconds: 1 ms apart up to 100 ms.
TOKEN_LATENCY_BUCKETS_S: Final = tuple(
    [0.0001, 0.00025, 0.0005] + _steps(0.001, 0.1, 0.001) + [0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5]
)
CONTEXT_TOKEN_BUCKETS: Final = (
    16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096,
    8192, 16384, 32768, 65536, 131072,
)
# A prediction's relative error |predicted p50 - actual| / actual: 1% to 10x.
PREDICTION_ERROR_BUCKETS: Final = (
    0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10)

# --- metrics -------------------------------------------------------------------------
Kind = Literal["histogram", "counter", "gauge"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    prom_name: str  # what Prometheus, rules and dashboards see
    otel_name: str  # what the OTel instrument is called
    unit: str
    kind: Kind
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


def _latency(prom: str, otel: str, what: str, buckets=LATENCY_BUCKETS_S) -> MetricDef:
    return MetricDef(prom, otel, "s", "histogram", what, (LABEL_CONTEXT_BUCKET,), buckets)


TTFT: Final = _latency(
    "gen_ai_server_time_to_first_token_seconds", "gen_ai.server.time_to_first_token",
    "Time from HTTP arrival to the engine's first output token reaching the server, "
    "streamed or not (vLLM's TTFT plus the time before the engine).")
TPOT: Final = _latency(
    "gen_ai_server_time_per_output_token_seconds", "gen_ai.server.time_per_output_token",
    "Mean time per output token after the first (decode time / (output tokens - 1)).",
    TOKEN_LATENCY_BUCKETS_S)
E2E: Final = _latency(
    "gen_ai_server_request_duration_seconds", "gen_ai.server.request.duration",
    "Time from request arrival to the last byte of the response.")
QUEUE: Final = _latency(
    "tailguard_request_queue_seconds", "tailguard.request.queue",
    "Time from the engine accepting a request to its first scheduling (includes the "
    "wait for a busy engine core to read it).")
PREFILL: Final = _latency(
    "tailguard_request_prefill_seconds", "tailguard.request.prefill",
    "Time from first scheduling to the first token (prompt processing).")
DECODE: Final = _latency(
    "tailguard_request_decode_seconds", "tailguard.request.decode",
    "Time from the first token to the last token.")
SAMPLING: Final = _latency(
    "tailguard_request_sampling_seconds", "tailguard.request.sampling",
    "Sum of the sampler's time over every engine step that carried the request.",
    TOKEN_LATENCY_BUCKETS_S)
CONTEXT_TOKENS: Final = MetricDef(
    "tailguard_request_context_tokens", "tailguard_request_context_tokens", "{token}",
    "histogram", "Prompt length of each request in tokens.", (), CONTEXT_TOKEN_BUCKETS)
BATCH_SIZE: Final = MetricDef(
    "tailguard_engine_batch_size", "tailguard_engine_batch_size", "{request}", "histogram",
    "Requests carried by each engine step.", (), (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256))
REQUESTS: Final = MetricDef(
    "tailguard_requests_total", "tailguard.requests", "", "counter",
    "Requests by outcome.", (LABEL_STATUS, LABEL_CONTEXT_BUCKET, LABEL_PRIORITY))
ERRORS: Final = MetricDef(
    "tailguard_request_errors_total", "tailguard.request.errors", "", "counter",
    "Failed or rejected requests by error type.", (LABEL_ERROR_TYPE, LABEL_HTTP_STATUS))
SLO_REQUESTS: Final = MetricDef(
    "tailguard_slo_requests_total", "tailguard.slo.requests", "", "counter",
    "Per-request verdicts against each SLO's context-aware target.",
    (LABEL_SLO, LABEL_CONTEXT_BUCKET, LABEL_RESULT))
KV_CACHE_USAGE: Final = MetricDef(
    "tailguard_kv_cache_usage_ratio", "tailguard_kv_cache_usage_ratio", "1", "gauge",
    "Fraction of the engine's KV-cache blocks in use.")
RUNNING: Final = MetricDef(
    "tailguard_requests_running", "tailguard_requests_running", "{request}", "gauge",
    "Requests in the engine's running batch.")
WAITING: Final = MetricDef(
    "tailguard_requests_waiting", "tailguard_requests_waiting", "{request}", "gauge",
    "Requests waiting in the engine's queue (queue depth).")
POLICY_ACTIVE: Final = MetricDef(
    "tailguard_policy_active", "tailguard_policy_active", "1", "gauge",
    "1 while a degradation policy is active.", (LABEL_POLICY,))
MEMORY_FORECAST: Final = MetricDef(
    "tailguard_memory_forecast_ratio", "tailguard_memory_forecast_ratio", "1", "gauge",
    "Forecast KV-cache usage at the given horizon.", (LABEL_HORIZON,))
KV_CACHE_EXHAUSTION: Final = MetricDef(
    "tailguard_kv_cache_exhaustion_seconds", "tailguard_kv_cache_exhaustion_seconds", "s",
    "gauge", "Seconds until the KV cache is full at the trend of its last 30 s (vLLM "
    "preempts then); 3600 when an hour or more away or not rising.")
KV_EXHAUSTION_CAP_S: Final = 3600.0  # OpenTelemetry gauges take finite values only
TRACE_ROWS_DROPPED: Final = MetricDef(
    "tailguard_trace_rows_dropped_total", "tailguard.trace.rows_dropped", "", "counter",
    "Trace-log rows lost for good: the memory bound was reached while the writer was "
    "behind or failing, or DuckDB refused their content.", (LABEL_TABLE,))
EVENT_LOOP_LAG: Final = MetricDef(  # 1 and 5 ms at p99: issue 20's light/saturated goals
    "tailguard_event_loop_lag_seconds", "tailguard_event_loop_lag_seconds", "s", "histogram",
    "How late the server's event loop ran a timer due now (sampled every 100 ms): time "
    "every request waits behind whatever holds the loop.", (), (0.0001, 0.00025, 0.0005, 0.001,
    0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
LENGTH_CLASS_BOUND: Final = MetricDef(
    "tailguard_length_class_bound_tokens", "tailguard_length_class_bound_tokens", "{token}",
    "gauge", "Seed 000's length-class boundaries in force (prompt tokens).", (LABEL_BOUND,))
CLIENT_REQUESTS: Final = MetricDef(
    "tailguard_client_requests_total", "tailguard.client.requests", "", "counter",
    "Requests per client (API key name) by outcome: good or late (served, against its SLO "
    "verdict), shed (by a policy), rejected, error, aborted.", (LABEL_CLIENT, LABEL_OUTCOME))


# The latency predictor judged live, per finished request, by the accuracy rule of
# slo/predict/accuracy.py: p50 MAPE = error _sum / _count, p90 coverage = within / judged.
def _prediction_error(prom: str, otel: str, what: str) -> MetricDef:
    return MetricDef(prom, otel, "1", "histogram",
                     f"Relative error of each served request's predicted p50 {what}: "
                     "abs(predicted - actual) / actual.",
                     (LABEL_CONTEXT_BUCKET,), PREDICTION_ERROR_BUCKETS)


def _prediction_count(prom: str, otel: str, what: str) -> MetricDef:
    return MetricDef(prom, otel, "", "counter", what, (LABEL_CONTEXT_BUCKET,))


PREDICTION_TTFT_ERROR: Final = _prediction_error(
    "tailguard_prediction_ttft_error_ratio", "tailguard_prediction_ttft_error_ratio", "TTFT")
PREDICTION_TTFT_JUDGED: Final = _prediction_count(
    "tailguard_prediction_ttft_judged_total", "tailguard.prediction.ttft.judged",
    "Served requests whose TTFT p90 prediction was judged.")
PREDICTION_TTFT_WITHIN_P90: Final = _prediction_count(
    "tailguard_prediction_ttft_within_p90_total", "tailguard.prediction.ttft.within_p90",
    "Judged requests whose TTFT was at or under its predicted p90.")
PREDICTION_TPOT_ERROR: Final = _prediction_error(
    "tailguard_prediction_tpot_error_ratio", "tailguard_prediction_tpot_error_ratio", "TPOT")
PREDICTION_TPOT_JUDGED: Final = _prediction_count(
    "tailguard_prediction_tpot_judged_total", "tailguard.prediction.tpot.judged",
    "Served requests with a TPOT whose TPOT p90 prediction was judged.")
PREDICTION_TPOT_WITHIN_P90: Final = _prediction_count(
    "tailguard_prediction_tpot_within_p90_total", "tailguard.prediction.tpot.within_p90",
    "Judged requests whose TPOT was at or under its predicted p90.")
# Per target of slo/predict/accuracy.py: (error histogram, judged, within p90).
PREDICTION_METRICS: Final = {
    "ttft_s": (PREDICTION_TTFT_ERROR, PREDICTION_TTFT_JUDGED, PREDICTION_TTFT_WITHIN_P90),
    "tpot_s": (PREDICTION_TPOT_ERROR, PREDICTION_TPOT_JUDGED, PREDICTION_TPOT_WITHIN_P90),
}

LATENCY_METRICS: Final = (TTFT, TPOT, E2E, QUEUE, PREFILL, DECODE, SAMPLING)
ALL_METRICS: Final = LATENCY_METRICS + (
    CONTEXT_TOKENS, BATCH_SIZE, REQUESTS, ERRORS, SLO_REQUESTS, KV_CACHE_USAGE,
    RUNNING, WAITING, POLICY_ACTIVE, MEMORY_FORECAST, KV_CACHE_EXHAUSTION,
    TRACE_ROWS_DROPPED, CLIENT_REQUESTS, EVENT_LOOP_LAG, LENGTH_CLASS_BOUND,
) + tuple(m for trio in PREDICTION_METRICS.values() for m in trio)

# --- thresholds the alerts and the dashboards share --------------------------------
KV_FULL_SOON_S: Final = 120  # the KV cache full within 2 min at its trend: preemptions ahead
# Memory pressure (SPEC §3; seed 002's memory forecast): KV-cache usage, measured or
# forecast, above which the degradation policy lowers batch / precision. The
# operational alerts fire above it; the engine and policy dashboards draw it.
MEMORY_PRESSURE_RATIO: Final = 0.9
# The latency predictor's live p90 coverage (PREDICTION_*_WITHIN_P90 / _JUDGED) below
# which it has drifted: the goal is 90% (85-95%, docs/prediction.md).
PREDICTION_COVERAGE_MIN: Final = 0.8

# --- recording rules (Sloth-compatible names) -----------------------------------------
# `tailguard rules` records every SLO the way Sloth (https://sloth.dev) does, so these
# names and labels are Sloth's and its Grafana dashboards work unchanged. `{}` is a
# window: 5m, 1h, ..., the SLO's period.
RECORD_SLI_ERROR: Final = "slo:sli_error:ratio_rate{}"
# Ours, not Sloth's: the same SLI per context bucket (labelled LABEL_CONTEXT_BUCKET).
RECORD_SLI_ERROR_BY_BUCKET: Final = "slo_context_bucket:sli_error:ratio_rate{}"
RECORD_OBJECTIVE: Final = "slo:objective:ratio"
RECORD_ERROR_BUDGET: Final = "slo:error_budget:ratio"
RECORD_TIME_PERIOD_DAYS: Final = "slo:time_period:days"
RECORD_CURRENT_BURN_RATE: Final = "slo:current_burn_rate:ratio"
RECORD_PERIOD_BURN_RATE: Final = "slo:period_burn_rate:ratio"
RECORD_PERIOD_BUDGET_REMAINING: Final = "slo:period_error_budget_remaining:ratio"
RECORD_SLO_INFO: Final = "sloth_slo_info"
# Labels of every recorded series: the SLO's id (service-name), service and name.
LABEL_SLOTH_ID: Final = "sloth_id"
LABEL_SLOTH_SERVICE: Final = "sloth_service"
LABEL_SLOTH_SLO: Final = "sloth_slo"
LABEL_SLOTH_WINDOW: Final = "sloth_window"  # on the SLI recordings
LABEL_SLOTH_SEVERITY: Final = "sloth_severity"  # on the burn-rate alerts
# Labels of RECORD_SLO_INFO only.
LABEL_SLOTH_MODE: Final = "sloth_mode"
LABEL_SLOTH_OBJECTIVE: Final = "sloth_objective"
LABEL_SLOTH_SPEC: Final = "sloth_spec"
LABEL_SLOTH_VERSION: Final = "sloth_version"

# --- spans ---------------------------------------------------------------------------
SPAN_REQUEST: Final = "llm.request"
SPAN_TOKENIZE: Final = "llm.tokenize"
SPAN_QUEUE: Final = "llm.queue"
SPAN_PREFILL: Final = "llm.prefill"
SPAN_DECODE: Final = "llm.decode"
SPAN_SAMPLING: Final = "llm.sampling"
SPAN_STEP: Final = "llm.step"
PHASE_SPANS: Final = (SPAN_QUEUE, SPAN_PREFILL, SPAN_DECODE, SPAN_SAMPLING)
ALL_SPANS: Final = (SPAN_REQUEST, SPAN_TOKENIZE) + PHASE_SPANS + (SPAN_STEP,)

# --- span attributes: OpenTelemetry GenAI conventions, then ours ----------------------
ATTR_OPERATION: Final = "gen_ai.operation.name"
# The trace log's `endpoint` -> its gen_ai.operation.name: a Responses API call is a chat.
OPERATIONS: Final = {"chat": "chat", "text_completion": "text_completion", "responses": "chat"}
ATTR_PROVIDER: Final = "gen_ai.provider.name"
ATTR_REQUEST_MODEL: Final = "gen_ai.request.model"
ATTR_RESPONSE_MODEL: Final = "gen_ai.response.model"
ATTR_RESPONSE_ID: Final = "gen_ai.response.id"
ATTR_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
ATTR_TEMPERATURE: Final = "gen_ai.request.temperature"
ATTR_TOP_P: Final = "gen_ai.request.top_p"
ATTR_STREAM: Final = "gen_ai.request.stream"
ATTR_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
ATTR_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ATTR_TTFT: Final = "gen_ai.server.time_to_first_token"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_HTTP_STATUS: Final = "http.response.status_code"
ATTR_CLIENT: Final = "enduser.id"  # the API key's name (never the key), or anonymous
ATTR_REQUEST_ID: Final = "tailguard.request_id"
ATTR_CONTEXT_BUCKET: Final = "tailguard.context_bucket"
ATTR_BATCH_BUCKET: Final = "tailguard.batch_bucket"
ATTR_PRIORITY: Final = "tailguard.priority"
ATTR_STATUS: Final = "tailguard.status"
ATTR_POLICY_ACTIONS: Final = "tailguard.policy_actions"
ATTR_ITERATIONS: Final = "tailguard.iterations"
ATTR_PREEMPTIONS: Final = "tailguard.preemptions"
ATTR_STEP_INDEX: Final = "tailguard.step.index"
ATTR_STEP_BATCH: Final = "tailguard.step.batch_size"
ATTR_STEP_TOKENS: Final = "tailguard.step.scheduled_tokens"
ATTR_STEP_PAIRS: Final = "tailguard.step.attention_pairs"
ATTR_STEP_FORWARD_S: Final = "tailguard.step.forward_s"
ATTR_STEP_SAMPLING_S: Final = "tailguard.step.sampling_s"
ATTR_STEP_WARMUP: Final = "tailguard.step.warmup"  # true on the engine warm-up's steps
ATTR_SAMPLING_STEPS: Final = "tailguard.sampling.steps"


def context_bucket(tokens: int) -> str:
    """The seed-003 bucket of a prompt length: 0-1k, 1k-4k, 4k-32k, 32k+."""
    for bound, name in zip(CONTEXT_BUCKET_BOUNDS, CONTEXT_BUCKETS):
        if tokens <= bound:
            return name
    return CONTEXT_BUCKETS[-1]


def batch_bucket(tokens: int, bounds: tuple[int, int] = BATCH_BUCKET_BOUNDS) -> str:
    """The seed-000 length class of a prompt under `bounds`: 0-256, 256-512, 512+ at first."""
    low, high = bounds
    return f"0-{low}" if tokens <= low else f"{low}-{high}" if tokens <= high else f"{high}+"
