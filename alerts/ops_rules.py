"""Operational alerts: thresholds from the seed articles' alert tables, as data.

Each alert is a row: name, severity, how long the condition must hold, PromQL built
from registry names, and annotations. `docs/alerts.md` has one runbook section per
row (a test checks the anchors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from alerts.config import RuleConfig
from alerts.promql import label_value, number, selector
from observe import registry as R

P99_MAX_S = 1.0  # seed 000 alert table: P99 > 1 s for 1 m
P99_RATE_WINDOW = "2m"  # >= 2 scrapes even at a 1 m scrape interval
ERROR_RATE_MAX = 0.01  # seed 000: error rate > 1% (`status` R.STATUS_ERROR: 5xx)
ERROR_RATE_WINDOW = "5m"
# KV-cache usage and its forecast: above R.MEMORY_PRESSURE_RATIO (SPEC §3, seed 002).
QUEUE_DEPTH_MAX = 5  # seed 000: queue depth > 5 triggers the max_new_tokens cap
BATCH_EFFICIENCY_MIN = 0.6  # seed 000: batch efficiency ("利用率") < 60%
# The latency predictor's live TTFT p90 coverage per context bucket over the window,
# below R.PREDICTION_COVERAGE_MIN for the hold; a window with fewer judged requests
# than the minimum (an idle server, a trickle) judges nothing.
COVERAGE_WINDOW = "10m"
COVERAGE_HOLD = "30m"
COVERAGE_MIN_JUDGED = 20
GROUP = "tailguard-operational-alerts"


@dataclass(frozen=True, slots=True)
class OpsAlert:
    name: str
    severity: str  # page | ticket
    hold: str  # Prometheus `for:`
    expr: Callable[[str], str]  # job -> PromQL
    summary: str
    description: str


def _p99(job: str) -> str:
    """From the classic buckets, or the native histogram where Prometheus keeps that
    instead (`serve --native-histograms`)."""
    buckets = selector(R.E2E.prom_name + "_bucket", job=job)
    native = selector(R.E2E.prom_name, job=job)
    window = P99_RATE_WINDOW
    return (f"(\n  histogram_quantile(0.99,\n    sum by (le) (rate({buckets}[{window}]))\n  )"
            f"\n  or\n  histogram_quantile(0.99, sum(rate({native}[{window}])))\n)"
            f" > {number(P99_MAX_S)}\n")


def _error_rate(job: str) -> str:
    failed = selector(R.REQUESTS.prom_name, job=job, **{R.LABEL_STATUS: R.STATUS_ERROR})
    every = selector(R.REQUESTS.prom_name, job=job)
    w = ERROR_RATE_WINDOW
    return (f"sum(rate({failed}[{w}]))\n/\nsum(rate({every}[{w}]))\n"
            f"> {number(ERROR_RATE_MAX)}\n")


def _gauge_above(metric: R.MetricDef, threshold: float, by: str = "instance"):
    return lambda job: (f"max by ({by}) ({selector(metric.prom_name, job=job)})"
                        f" > {number(threshold)}\n")


def _gauge_below(metric: R.MetricDef, threshold: float):
    return lambda job: (f"min by (instance) ({selector(metric.prom_name, job=job)})"
                        f" < {number(threshold)}\n")


def _batch_efficiency(job: str) -> str:
    running = f"sum by (instance) ({selector(R.RUNNING.prom_name, job=job)})"
    waiting = f"sum by (instance) ({selector(R.WAITING.prom_name, job=job)})"
    return (f"{running}\n/\n(\n  {running}\n  + {waiting}\n)\n"
            f"< {number(BATCH_EFFICIENCY_MIN)}\n")


def _prediction_coverage(job: str) -> str:
    def judged(metric: R.MetricDef) -> str:
        return (f"sum by (instance, {R.LABEL_CONTEXT_BUCKET}) "
                f"(increase({selector(metric.prom_name, job=job)}[{COVERAGE_WINDOW}]))")

    every = judged(R.PREDICTION_TTFT_JUDGED)
    return (f"{judged(R.PREDICTION_TTFT_WITHIN_P90)}\n/\n{every}\n"
            f"< {number(R.PREDICTION_COVERAGE_MIN)}\nand\n{every}\n>= {COVERAGE_MIN_JUDGED}\n")


_VALUE_PCT = "{{ $value | humanizePercentage }}"
_ON = "on {{ $labels.instance }}"

OPS_ALERTS = (
    OpsAlert("TailguardHighP99Latency", "page", "1m", _p99,
             f"P99 end-to-end latency above {P99_MAX_S:g} s.",
             f"P99 of {R.E2E.prom_name} over {P99_RATE_WINDOW} is"
             f" {{{{ $value | humanizeDuration }}}} (threshold {P99_MAX_S:g}s, seed 000)."),
    OpsAlert("TailguardHighErrorRate", "page", "1m", _error_rate,
             f"More than {ERROR_RATE_MAX:.0%} of requests fail.",
             f"{_VALUE_PCT} of requests over {ERROR_RATE_WINDOW} ended with status"
             f" {R.STATUS_ERROR} (5xx; threshold {ERROR_RATE_MAX:.0%})."),
    OpsAlert("TailguardKVCacheNearlyFull", "ticket", "5m",
             _gauge_above(R.KV_CACHE_USAGE, R.MEMORY_PRESSURE_RATIO),
             f"KV cache above {R.MEMORY_PRESSURE_RATIO:.0%} {_ON}.",
             f"The engine {_ON} uses {_VALUE_PCT} of its KV-cache blocks (threshold"
             f" {R.MEMORY_PRESSURE_RATIO:.0%}); preemptions and queueing follow."),
    OpsAlert("TailguardMemoryForecastHigh", "ticket", "1m",
             _gauge_above(R.MEMORY_FORECAST, R.MEMORY_PRESSURE_RATIO,
                          f"instance, {R.LABEL_HORIZON}"),
             f"KV-cache usage forecast above {R.MEMORY_PRESSURE_RATIO:.0%} {_ON}.",
             f"The memory forecast {_ON} at horizon {label_value(R.LABEL_HORIZON)} is"
             f" {_VALUE_PCT} (threshold {R.MEMORY_PRESSURE_RATIO:.0%})."),
    OpsAlert("TailguardKVCacheFullSoon", "ticket", "1m",
             _gauge_below(R.KV_CACHE_EXHAUSTION, R.KV_FULL_SOON_S),
             f"KV cache full within {R.KV_FULL_SOON_S} s at its trend {_ON}.",
             f"At the trend of the last 30 s the KV cache {_ON} is full in"
             f" {{{{ $value | humanizeDuration }}}} (threshold {R.KV_FULL_SOON_S} s); vLLM"
             " preempts requests then. The memory-pressure policy acts on the same"
             " estimate."),
    OpsAlert("TailguardQueueDepthHigh", "ticket", "1m",
             _gauge_above(R.WAITING, QUEUE_DEPTH_MAX),
             f"More than {QUEUE_DEPTH_MAX} requests waiting {_ON}.",
             f"{{{{ $value }}}} requests wait in the engine queue {_ON} (threshold"
             f" {QUEUE_DEPTH_MAX}, the queue-depth policy's trigger)."),
    OpsAlert("TailguardLowBatchEfficiency", "ticket", "5m", _batch_efficiency,
             f"Batch efficiency below {BATCH_EFFICIENCY_MIN:.0%} {_ON}.",
             f"Only {_VALUE_PCT} of the requests in the engine {_ON} are in the running"
             " batch; the rest wait (running / (running + waiting), threshold"
             f" {BATCH_EFFICIENCY_MIN:.0%})."),
    OpsAlert("TailguardPredictionCoverageLow", "ticket", COVERAGE_HOLD, _prediction_coverage,
             "Latency predictor's p90 TTFT coverage below"
             f" {R.PREDICTION_COVERAGE_MIN:.0%} {_ON}.",
             f"Only {_VALUE_PCT} of the requests {_ON} in context bucket"
             f" {label_value(R.LABEL_CONTEXT_BUCKET)} over {COVERAGE_WINDOW} had a TTFT at or"
             f" under its predicted p90 (threshold {R.PREDICTION_COVERAGE_MIN:.0%}, goal 90%):"
             " the predictor has drifted and admission decisions rest on it."),
    OpsAlert("TailguardTargetDown", "page", "1m", lambda job: f'up{{job="{job}"}} == 0\n',
             "Prometheus cannot scrape {{ $labels.instance }}.",
             "The scrape of {{ $labels.instance }} (job {{ $labels.job }}) fails;"
             " the server is down or /metrics does not answer."),
    OpsAlert("TailguardTargetAbsent", "page", "5m", lambda job: f'absent(up{{job="{job}"}})\n',
             "No tailguard scrape target.",
             "Prometheus has no target in job {{ $labels.job }}: no SLO or alert"
             " here can fire. Check the scrape configuration and service discovery."),
)


def ops_group(config: RuleConfig) -> dict:
    return {"name": GROUP, "rules": [_rule(a, config) for a in OPS_ALERTS]}


def _rule(alert: OpsAlert, config: RuleConfig) -> dict:
    return {"alert": alert.name, "expr": alert.expr(config.job), "for": alert.hold,
            "labels": {"severity": alert.severity},
            "annotations": {"summary": alert.summary, "description": alert.description,
                            "runbook_url": config.runbook(alert.name)}}
