"""promtool unit tests for each SLO's recordings and burn-rate alerts.

Recording rules are checked at values that are exact in floating point (rates of
whole events per second, ratios of small integers). Alerts are checked by scenario:
a per-minute share of bad events, replayed as `good`/`bad` counters. What each
scenario should do comes from the burn windows (`burn_outcome` models the rate
windows both ways Prometheus has bounded them); a scenario whose outcome is
ambiguous or infeasible for this SLO's objective is left out rather than guessed.
"""

from __future__ import annotations

from alerts.config import RuleConfig
from alerts.promtool import counter_values, expected_alert, series
from alerts.slo_rules import BURN_ALERT, burn_alerts, error_budget, slo_labels
from alerts.slo_windows import Scenario, burn_outcome, scenarios
from observe import registry as R
from slo.durations import parse_duration
from slo.spec import SLO, SLOSpec
from slo.windows import BURN_WINDOWS, sli_windows

VOLUME = 1000.0  # events per minute in alert scenarios
PER_SECOND = 60.0  # one event per second: rates come out as whole numbers
SHORT = min((w.short for w in BURN_WINDOWS), key=parse_duration)  # 5m
EVAL = "10m"


def slo_tests(spec: SLOSpec, config: RuleConfig) -> list[dict]:
    """Recordings for every SLO; alert scenarios once per (objective, period), since
    SLOs that share both have the same thresholds (and promtool time adds up)."""
    tests, seen = [], set()
    for slo in spec.slos:
        labels = slo_labels(spec.service, slo)
        tests += [f(slo, labels, config.job)
                  for f in (_recordings, _fleet, _period, _all_good, _idle)]
        if (slo.objective, slo.window_s) not in seen:
            seen.add((slo.objective, slo.window_s))
            alerts = burn_alerts(slo, labels, config)
            tests += [t for s in scenarios(slo)
                      if (t := _scenario(s, slo, labels, alerts, config.job))]
    return tests


def _counter(job: str, slo: SLO, bucket: str, result: str, increments: list[float],
             **instance: str) -> dict:
    name = series(R.SLO_REQUESTS.prom_name, job,
                  **{**instance, R.LABEL_SLO: slo.name, R.LABEL_CONTEXT_BUCKET: bucket,
                     R.LABEL_RESULT: result})
    return {"series": name, "values": counter_values(increments)}


def _sample(record: str, labels: dict, value: float, **extra: str) -> dict:
    body = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, **extra}.items()))
    return {"expr": f"{record}{{{body}}}", "eval_time": EVAL,
            "exp_samples": [{"labels": f"{record}{{{body}}}", "value": value}]}


def _recordings(slo: SLO, labels: dict, job: str) -> dict:
    """Three context buckets: half bad, all bad, all good (no `bad` series at all)."""
    b0, b1, b2 = R.CONTEXT_BUCKETS[:3]
    minutes = 10
    inputs = [_counter(job, slo, b0, R.RESULT_BAD, [PER_SECOND] * minutes),
              _counter(job, slo, b0, R.RESULT_GOOD, [PER_SECOND] * minutes),
              _counter(job, slo, b1, R.RESULT_BAD, [2 * PER_SECOND] * minutes),
              _counter(job, slo, b2, R.RESULT_GOOD, [PER_SECOND] * minutes)]
    ratio = 3 / 5  # (1 + 2) bad per second out of (1 + 1 + 2 + 1)
    budget = error_budget(slo)
    window = {R.LABEL_SLOTH_WINDOW: SHORT}
    bucket = R.RECORD_SLI_ERROR_BY_BUCKET.format(SHORT)
    tests = [
        _sample(R.RECORD_SLI_ERROR.format(SHORT), labels, ratio, **window),
        _sample(bucket, labels, 0.5, **window, **{R.LABEL_CONTEXT_BUCKET: b0}),
        _sample(bucket, labels, 1.0, **window, **{R.LABEL_CONTEXT_BUCKET: b1}),
        _sample(bucket, labels, 0.0, **window, **{R.LABEL_CONTEXT_BUCKET: b2}),
        _sample(R.RECORD_OBJECTIVE, labels, slo.objective),
        _sample(R.RECORD_ERROR_BUDGET, labels, budget),
        _sample(R.RECORD_TIME_PERIOD_DAYS, labels, slo.window_s / 86400),
        # `group_left` keeps the SLI's `sloth_window`, as in Sloth's own output.
        _sample(R.RECORD_CURRENT_BURN_RATE, labels, ratio / budget, **window),
    ]
    return {"name": f"{slo.name}: SLI, per-bucket SLI and metadata recordings",
            "interval": "1m", "input_series": inputs, "promql_expr_test": tests}


def _fleet(slo: SLO, labels: dict, job: str) -> dict:
    """Two replicas (seed 001's hot and cold paths, docs/deployment.md): one all bad at
    1/s, one all good at 3/s; the SLI is the fleet's, 1 bad in 4, with no instance."""
    b0 = R.CONTEXT_BUCKETS[0]
    inputs = [_counter(job, slo, b0, R.RESULT_BAD, [PER_SECOND] * 10, instance="hot:8001"),
              _counter(job, slo, b0, R.RESULT_GOOD, [3 * PER_SECOND] * 10,
                       instance="cold:8002")]
    window = {R.LABEL_SLOTH_WINDOW: SHORT}
    tests = [_sample(R.RECORD_SLI_ERROR.format(SHORT), labels, 0.25, **window),
             _sample(R.RECORD_SLI_ERROR_BY_BUCKET.format(SHORT), labels, 0.25, **window,
                     **{R.LABEL_CONTEXT_BUCKET: b0})]
    return {"name": f"{slo.name}: the SLI of two replicas is the fleet's",
            "interval": "1m", "input_series": inputs, "promql_expr_test": tests}


def _period(slo: SLO, labels: dict, job: str) -> dict:
    """Half of the events bad from the start: every 5m ratio is exactly 0.5."""
    b0 = R.CONTEXT_BUCKETS[0]
    inputs = [_counter(job, slo, b0, result, [PER_SECOND] * 10)
              for result in (R.RESULT_BAD, R.RESULT_GOOD)]
    period = {R.LABEL_SLOTH_WINDOW: slo.window}
    burn = 0.5 / error_budget(slo)
    tests = [
        _sample(R.RECORD_SLI_ERROR.format(slo.window), labels, 0.5, **period),
        _sample(R.RECORD_SLI_ERROR_BY_BUCKET.format(slo.window), labels, 0.5, **period,
                **{R.LABEL_CONTEXT_BUCKET: b0}),
        _sample(R.RECORD_PERIOD_BURN_RATE, labels, burn, **period),
        _sample(R.RECORD_PERIOD_BUDGET_REMAINING, labels, 1 - burn, **period),
    ]
    return {"name": f"{slo.name}: period SLI, period burn rate and remaining budget",
            "interval": "1m", "input_series": inputs, "promql_expr_test": tests}


def _all_good(slo: SLO, labels: dict, job: str) -> dict:
    """No bad event ever, hence no `bad` series: the error ratio is 0, not missing."""
    b0 = R.CONTEXT_BUCKETS[0]
    inputs = [_counter(job, slo, b0, R.RESULT_GOOD, [PER_SECOND] * 10)]
    window, period = {R.LABEL_SLOTH_WINDOW: SHORT}, {R.LABEL_SLOTH_WINDOW: slo.window}
    tests = [_sample(R.RECORD_SLI_ERROR.format(SHORT), labels, 0.0, **window),
             _sample(R.RECORD_SLI_ERROR.format(slo.window), labels, 0.0, **period),
             _sample(R.RECORD_SLI_ERROR_BY_BUCKET.format(SHORT), labels, 0.0, **window,
                     **{R.LABEL_CONTEXT_BUCKET: b0}),
             _sample(R.RECORD_PERIOD_BUDGET_REMAINING, labels, 1.0, **period)]
    return {"name": f"{slo.name}: no bad event is an error ratio of 0",
            "interval": "1m", "input_series": inputs, "promql_expr_test": tests}


def _idle(slo: SLO, labels: dict, job: str) -> dict:
    """Counters that exist but do not move: no ratio (not NaN) in any window."""
    b0 = R.CONTEXT_BUCKETS[0]
    inputs = [_counter(job, slo, b0, result, [0.0] * 10)
              for result in (R.RESULT_BAD, R.RESULT_GOOD)]
    tests = [{"expr": R.RECORD_SLI_ERROR.format(w), "eval_time": EVAL, "exp_samples": []}
             for w in sli_windows(slo.window_s)]
    return {"name": f"{slo.name}: an idle SLO has no error ratio",
            "interval": "1m", "input_series": inputs, "promql_expr_test": tests}


def _scenario(scenario: Scenario, slo: SLO, labels: dict, alerts: list[dict],
              job: str) -> dict | None:
    if burn_outcome(scenario, slo) != set(scenario.expect):
        return None  # ambiguous for this objective: leave it out rather than guess
    b0 = R.CONTEXT_BUCKETS[0]
    bad = [p * VOLUME for p in scenario.profile]
    good = [(1 - p) * VOLUME for p in scenario.profile]
    expected = [expected_alert(rule, labels) for rule in alerts
                if rule["labels"]["severity"] in scenario.expect]
    return {"name": f"{slo.name}: {scenario.name}", "interval": "1m",
            "input_series": [_counter(job, slo, b0, R.RESULT_BAD, bad),
                             _counter(job, slo, b0, R.RESULT_GOOD, good)],
            "alert_rule_test": [{"eval_time": f"{len(scenario.profile)}m",
                                 "alertname": BURN_ALERT, "exp_alerts": expected}]}
