"""Sloth-compatible SLO rules: SLI recordings, metadata and burn-rate alerts.

Names and labels are Sloth's (`slo:sli_error:ratio_rate5m`, `sloth_id`, ...; all
defined in `observe.registry`), so Sloth's Grafana dashboards work on them unchanged.
Burn-rate alerts follow the multi-window, multi-burn-rate scheme kept as data in
`slo.windows`; each factor comes from `BurnWindow.factor(period)`. We add one thing
Sloth has no notion of: the same SLI per context bucket
(`slo_context_bucket:sli_error:ratio_rate5m`).
"""

from __future__ import annotations

from alerts.config import SLOTH_MODE, SLOTH_SPEC, RuleConfig
from alerts.promql import (
    label_value,
    labels_selector,
    number,
    period_average,
    sli_error_ratio,
)
from observe import registry as R
from slo.spec import SLO, SLOSpec
from slo.windows import BURN_WINDOWS, BurnWindow, sli_windows

BURN_ALERT = "TailguardErrorBudgetBurn"
SEVERITIES = tuple(dict.fromkeys(w.severity for w in BURN_WINDOWS))  # page, ticket
_ID_LABELS = ", ".join((R.LABEL_SLOTH_ID, R.LABEL_SLOTH_SLO, R.LABEL_SLOTH_SERVICE))


def slo_labels(service: str, slo: SLO) -> dict[str, str]:
    return {R.LABEL_SLOTH_ID: f"{service}-{slo.name}", R.LABEL_SLOTH_SERVICE: service,
            R.LABEL_SLOTH_SLO: slo.name}


def error_budget(slo: SLO) -> float:
    """1 - objective without float noise (0.01, not 0.010000000000000009)."""
    return round(slo.error_budget, 12)


def slo_groups(spec: SLOSpec, config: RuleConfig) -> list[dict]:
    groups = []
    for slo in spec.slos:
        labels = slo_labels(spec.service, slo)
        groups += [_sli_group(slo, labels, config.job), _meta_group(slo, labels, config),
                   _alert_group(slo, labels, config), _bucket_group(slo, labels, config.job)]
    return groups


def _sli_rules(slo: SLO, labels: dict, job: str, record: str, by: tuple[str, ...]) -> list:
    windows = sli_windows(slo.window_s)
    rules = []
    for window in windows:
        if window == slo.window and window != windows[0]:
            expr = period_average(record.format(windows[0]), labels, window)
        else:
            expr = sli_error_ratio(job, slo.name, window, by)
        rules.append({"record": record.format(window), "expr": expr,
                      "labels": {**labels, R.LABEL_SLOTH_WINDOW: window}})
    return rules


def _sli_group(slo: SLO, labels: dict, job: str) -> dict:
    return {"name": f"sloth-slo-sli-recordings-{labels[R.LABEL_SLOTH_ID]}",
            "rules": _sli_rules(slo, labels, job, R.RECORD_SLI_ERROR, ())}


def _bucket_group(slo: SLO, labels: dict, job: str) -> dict:
    return {"name": f"tailguard-slo-sli-by-context-bucket-{labels[R.LABEL_SLOTH_ID]}",
            "rules": _sli_rules(slo, labels, job, R.RECORD_SLI_ERROR_BY_BUCKET,
                                (R.LABEL_CONTEXT_BUCKET,))}


def _meta_group(slo: SLO, labels: dict, config: RuleConfig) -> dict:
    sli_5m = labels_selector(R.RECORD_SLI_ERROR.format(sli_windows(slo.window_s)[0]), labels)
    sli_period = labels_selector(R.RECORD_SLI_ERROR.format(slo.window), labels)
    budget = labels_selector(R.RECORD_ERROR_BUDGET, labels)
    per_budget = f"\n/ on({_ID_LABELS}) group_left\n{budget}\n"
    info = {**labels, R.LABEL_SLOTH_MODE: SLOTH_MODE,
            R.LABEL_SLOTH_OBJECTIVE: _percent(slo.objective), R.LABEL_SLOTH_SPEC: SLOTH_SPEC,
            R.LABEL_SLOTH_VERSION: config.version}
    rules = [
        (R.RECORD_OBJECTIVE, f"vector({number(slo.objective)})", labels),
        (R.RECORD_ERROR_BUDGET, f"vector({number(error_budget(slo))})", labels),
        (R.RECORD_TIME_PERIOD_DAYS, f"vector({number(slo.window_s / 86400)})", labels),
        (R.RECORD_CURRENT_BURN_RATE, sli_5m + per_budget, labels),
        (R.RECORD_PERIOD_BURN_RATE, sli_period + per_budget, labels),
        (R.RECORD_PERIOD_BUDGET_REMAINING,
         "1 - " + labels_selector(R.RECORD_PERIOD_BURN_RATE, labels), labels),
        (R.RECORD_SLO_INFO, "vector(1)", dict(sorted(info.items()))),
    ]
    return {"name": f"sloth-slo-meta-recordings-{labels[R.LABEL_SLOTH_ID]}",
            "rules": [{"record": r, "expr": e, "labels": lb} for r, e, lb in rules]}


def _alert_group(slo: SLO, labels: dict, config: RuleConfig) -> dict:
    return {"name": f"sloth-slo-alerts-{labels[R.LABEL_SLOTH_ID]}",
            "rules": burn_alerts(slo, labels, config)}


def burn_alerts(slo: SLO, labels: dict, config: RuleConfig) -> list[dict]:
    """One alert per severity (page, ticket), each OR-ing its burn windows."""
    return [_burn_alert(slo, labels, config, severity) for severity in SEVERITIES]


def _burn_alert(slo: SLO, labels: dict, config: RuleConfig, severity: str) -> dict:
    windows = [w for w in BURN_WINDOWS if w.severity == severity]
    clauses = "\nor\n".join(_clause(w, slo, labels) for w in windows)
    conditions = " or ".join(
        f"{w.factor(slo.window_s):g}x over {w.long} and {w.short}" for w in windows)
    return {
        "alert": BURN_ALERT,
        "expr": clauses + "\n",
        # The SLO's labels too, so that no two rules look alike to `promtool check rules`.
        "labels": {"severity": severity, R.LABEL_SLOTH_SEVERITY: severity, **labels},
        "annotations": {
            "summary": f"{label_value(R.LABEL_SLOTH_SERVICE)} {label_value(R.LABEL_SLOTH_SLO)}"
                       f" SLO error budget burn rate is too fast ({severity}).",
            "description": (
                f"SLO {slo.name} ({slo.sli}, objective {_percent(slo.objective)}% over"
                f" {slo.window}) is burning its error budget at more than {conditions}."
                f" Current burn: {labels_selector(R.RECORD_CURRENT_BURN_RATE, labels)}."),
            "runbook_url": config.runbook(BURN_ALERT),
        },
    }


def _clause(window: BurnWindow, slo: SLO, labels: dict) -> str:
    threshold = f"({number(window.factor(slo.window_s))} * {number(error_budget(slo))})"
    parts = [f"    max({labels_selector(R.RECORD_SLI_ERROR.format(w), labels)} > {threshold})"
             f" without ({R.LABEL_SLOTH_WINDOW})" for w in (window.short, window.long)]
    return "(\n" + "\n    and\n".join(parts) + "\n)"


def _percent(ratio: float) -> str:
    """0.9995 -> "99.95" (Sloth's `sloth_objective`)."""
    return f"{ratio * 100:.10g}"
