"""promtool unit tests for the operational alerts: one case table per alert.

Each case replays series for ten minutes and checks the alert twice: before its
`for:` has elapsed (silent) and after (firing with the expected labels and
rendered annotations), or, for the below-threshold case, silent at the end.
Values are chosen so that what the annotations print is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from alerts.config import RuleConfig
from alerts.ops_rules import OPS_ALERTS, ops_group
from alerts.promtool import INSTANCE as HOST
from alerts.promtool import counter_values, expected_alert, gauge_values, series
from observe import registry as R

MINUTES = 10
EARLY = "0m"  # before any `for:` has elapsed; the last minute of a case's series is after
INSTANCE = {"instance": HOST}
JOB = {"job": "$job"}  # stands for the configured job in expected labels
BUCKET = {R.LABEL_CONTEXT_BUCKET: R.CONTEXT_BUCKETS[0]}


@dataclass(frozen=True, slots=True)
class Case:
    alert: str
    name: str  # a sentence
    inputs: tuple[tuple[str, dict, str], ...]  # (metric, labels, values)
    value: float | None = None  # the alert's value when it fires; None: silent
    labels: dict = field(default_factory=dict)  # result labels of the firing alert
    minutes: int = MINUTES  # how long the series run; checked late in their last minute


def _e2e(share_le_1: float) -> tuple:
    """A latency histogram, 60 requests a minute, `share_le_1` of them in (0.5, 1] s,
    the rest in (1, 2.5] s."""
    fast = share_le_1 * 60
    counts = {"0.5": 0.0, "1": fast, "2.5": 60.0, "+Inf": 60.0}
    return tuple((R.E2E.prom_name + "_bucket", {**BUCKET, "le": le},
                  counter_values([n] * MINUTES)) for le, n in counts.items())


def _requests(error_share: float) -> tuple:
    per_min = {R.STATUS_OK: 1000 * (1 - error_share), R.STATUS_ERROR: 1000 * error_share}
    return tuple((R.REQUESTS.prom_name,
                  {R.LABEL_STATUS: s, **BUCKET, R.LABEL_PRIORITY: R.PRIORITY_REALTIME},
                  counter_values([n] * MINUTES)) for s, n in per_min.items())


def _gauge(metric: R.MetricDef, value: float, **labels: str) -> tuple:
    return ((metric.prom_name, labels, gauge_values([value] * (MINUTES + 1))),)


def _engine(running: float, waiting: float) -> tuple:
    return _gauge(R.RUNNING, running) + _gauge(R.WAITING, waiting)


COVERAGE_MINUTES = 40  # past the 30 m hold of TailguardPredictionCoverageLow


def _coverage(judged: float, within: float) -> tuple:
    """COVERAGE_MINUTES minutes of `judged` TTFT predictions a minute, `within` of them covered."""
    return tuple((m.prom_name, BUCKET, counter_values([n] * COVERAGE_MINUTES))
                 for m, n in ((R.PREDICTION_TTFT_JUDGED, judged),
                              (R.PREDICTION_TTFT_WITHIN_P90, within)))


HORIZON = {R.LABEL_HORIZON: "5m"}
CASES = (
    Case("TailguardHighP99Latency", "every request slower than 1 s", _e2e(0.0),
         1 + (2.5 - 1) * 0.99),
    Case("TailguardHighP99Latency", "every request within 1 s", _e2e(1.0)),
    Case("TailguardHighErrorRate", "2% of requests fail", _requests(0.02), 0.02),
    Case("TailguardHighErrorRate", "0.5% of requests fail", _requests(0.005)),
    Case("TailguardKVCacheNearlyFull", "KV cache at 95%", _gauge(R.KV_CACHE_USAGE, 0.95),
         0.95, INSTANCE),
    Case("TailguardKVCacheNearlyFull", "KV cache at 85%", _gauge(R.KV_CACHE_USAGE, 0.85)),
    Case("TailguardMemoryForecastHigh", "forecast at 95%",
         _gauge(R.MEMORY_FORECAST, 0.95, **HORIZON), 0.95, {**INSTANCE, **HORIZON}),
    Case("TailguardMemoryForecastHigh", "forecast at 80%",
         _gauge(R.MEMORY_FORECAST, 0.8, **HORIZON)),
    Case("TailguardKVCacheFullSoon", "KV cache full in 45 s",
         _gauge(R.KV_CACHE_EXHAUSTION, 45), 45, INSTANCE),
    Case("TailguardKVCacheFullSoon", "KV cache full in 10 min",
         _gauge(R.KV_CACHE_EXHAUSTION, 600)),
    Case("TailguardQueueDepthHigh", "8 requests waiting", _engine(4, 8), 8, INSTANCE),
    Case("TailguardQueueDepthHigh", "5 requests waiting", _engine(4, 5)),
    Case("TailguardLowBatchEfficiency", "2 running, 4 waiting", _engine(2, 4), 2 / 6, INSTANCE),
    Case("TailguardLowBatchEfficiency", "8 running, 1 waiting", _engine(8, 1)),
    Case("TailguardLowBatchEfficiency", "an idle engine", _engine(0, 0)),
    Case("TailguardPredictionCoverageLow", "half the requests are within their p90",
         _coverage(60, 30), 0.5, {**INSTANCE, **BUCKET}, COVERAGE_MINUTES),
    Case("TailguardPredictionCoverageLow", "95% of the requests are within their p90",
         _coverage(60, 57), minutes=COVERAGE_MINUTES),
    Case("TailguardPredictionCoverageLow", "a trickle of requests is judged, none covered",
         _coverage(1, 0), minutes=COVERAGE_MINUTES),
    Case("TailguardTargetDown", "the scrape fails",
         (("up", INSTANCE, gauge_values([0] * (MINUTES + 1))),), 0.0, {**JOB, **INSTANCE}),
    Case("TailguardTargetDown", "the scrape succeeds",
         (("up", INSTANCE, gauge_values([1] * (MINUTES + 1))),)),
    Case("TailguardTargetAbsent", "only another job is scraped",
         (("up", {"job": "other", **INSTANCE}, gauge_values([1] * (MINUTES + 1))),),
         1.0, JOB),
    Case("TailguardTargetAbsent", "the job is scraped",
         (("up", INSTANCE, gauge_values([1] * (MINUTES + 1))),)),
)


def ops_tests(config: RuleConfig) -> list[dict]:
    rules = {r["alert"]: r for r in ops_group(config)["rules"]}
    return [_test(case, rules[case.alert], config.job) for case in CASES]


def _test(case: Case, rule: dict, job: str) -> dict:
    inputs = [{"series": series(m, job, **labels) if m != "up" else _up(job, labels),
               "values": values} for m, labels, values in case.inputs]
    late = f"{case.minutes - 1}m"
    checks = [{"eval_time": late, "alertname": case.alert, "exp_alerts": []}]
    if case.value is not None:
        labels = {k: job if v == JOB["job"] else v for k, v in case.labels.items()}
        checks = [{"eval_time": EARLY, "alertname": case.alert, "exp_alerts": []},
                  {"eval_time": late, "alertname": case.alert,
                   "exp_alerts": [expected_alert(rule, labels, case.value)]}]
    verb = "fires" if case.value is not None else "stays silent"
    return {"name": f"{case.alert} {verb} when {case.name}", "interval": "1m",
            "input_series": inputs, "alert_rule_test": checks}


def _up(job: str, labels: dict) -> str:
    merged = {"job": job, **labels}
    return "up{" + ",".join(f'{k}="{v}"' for k, v in merged.items()) + "}"


def covered() -> set[str]:
    """Alerts with at least one firing and one silent case."""
    fires = {c.alert for c in CASES if c.value is not None}
    silent = {c.alert for c in CASES if c.value is None}
    return fires & silent & {a.name for a in OPS_ALERTS}
