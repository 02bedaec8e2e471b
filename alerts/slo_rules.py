"""Sloth-compatible SLO rules: SLI recordings, metadata and burn-rate alerts.

Names and labels are Sloth's (`slo:sli_error:ratio_rate5m`, `sloth_id`, ...), so
Sloth's Grafana dashboards work on them unchanged. Burn-rate alerts follow the
multi-window, multi-burn-rate scheme kept as data in `slo.windows`; each factor
comes from `BurnWindow.factor(period)`. We add one thing Sloth has no notion of:
the same SLI per context bucket (`slo_context_bucket:sli_error:ratio_rate5m`).
"""

from __future__ import annotations

from alerts.config import SLOTH_MODE, SLOTH_SPEC, RuleConfig
from alerts.promql import (BUCKET_LABEL, labels_selector, number, period_average,
                           sli_error_ratio)
from slo.spec import SLO, SLOSpec
from slo.windows import BURN_WINDOWS, BurnWindow, sli_windows

SLI_RECORD = "slo:sli_error:ratio_rate{}"
BUCKET_RECORD = "slo_context_bucket:sli_error:ratio_rate{}"
BURN_ALERT = "TailguardErrorBudgetBurn"
SEVERITIES = tuple(dict.fromkeys(w.severity for w in BURN_WINDOWS))  # page, ticket
_ID_LABELS = "sloth_id, sloth_slo, sloth_service"


def slo_labels(service: str, slo: SLO) -> dict[str, str]:
    return {"sloth_id": f"{service}-{slo.name}", "sloth_service": service, "sloth_slo": slo.name}


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
                      "labels": {**labels, "sloth_window": window}})
    return rules


def _sli_group(slo: SLO, labels: dict, job: str) -> dict:
    return {"name": f"sloth-slo-sli-recordings-{labels['sloth_id']}",
            "rules": _sli_rules(slo, labels, job, SLI_RECORD, ())}


def _bucket_group(slo: SLO, labels: dict, job: str) -> dict:
    return {"name": f"tailguard-slo-sli-by-context-bucket-{labels['sloth_id']}",
            "rules": _sli_rules(slo, labels, job, BUCKET_RECORD, (BUCKET_LABEL,))}


def _meta_group(slo: SLO, labels: dict, config: RuleConfig) -> dict:
    sli_5m = labels_selector(SLI_RECORD.format(sli_windows(slo.window_s)[0]), labels)
    sli_period = labels_selector(SLI_RECORD.format(slo.window), labels)
    budget = labels_selector("slo:error_budget:ratio", labels)
    per_budget = f"\n/ on({_ID_LABELS}) group_left\n{budget}\n"
    info = {**labels, "sloth_mode": SLOTH_MODE, "sloth_objective": _percent(slo.objective),
            "sloth_spec": SLOTH_SPEC, "sloth_version": config.version}
    rules = [
        ("slo:objective:ratio", f"vector({number(slo.objective)})", labels),
        ("slo:error_budget:ratio", f"vector({number(error_budget(slo))})", labels),
        ("slo:time_period:days", f"vector({number(slo.window_s / 86400)})", labels),
        ("slo:current_burn_rate:ratio", sli_5m + per_budget, labels),
        ("slo:period_burn_rate:ratio", sli_period + per_budget, labels),
        ("slo:period_error_budget_remaining:ratio",
         "1 - " + labels_selector("slo:period_burn_rate:ratio", labels), labels),
        ("sloth_slo_info", "vector(1)", dict(sorted(info.items()))),
    ]
    return {"name": f"sloth-slo-meta-recordings-{labels['sloth_id']}",
            "rules": [{"record": r, "expr": e, "labels": lb} for r, e, lb in rules]}


def _alert_group(slo: SLO, labels: dict, config: RuleConfig) -> dict:
    return {"name": f"sloth-slo-alerts-{labels['sloth_id']}",
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
        "labels": {"severity": severity, "sloth_severity": severity, **labels},
        "annotations": {
            "summary": "{{ $labels.sloth_service }} {{ $labels.sloth_slo }} SLO error budget"
                       f" burn rate is too fast ({severity}).",
            "description": (
                f"SLO {slo.name} ({slo.sli}, objective {_percent(slo.objective)}% over"
                f" {slo.window}) is burning its error budget at more than {conditions}."
                f" Current burn: {labels_selector('slo:current_burn_rate:ratio', labels)}."),
            "runbook_url": config.runbook(BURN_ALERT),
        },
    }


def _clause(window: BurnWindow, slo: SLO, labels: dict) -> str:
    threshold = f"({number(window.factor(slo.window_s))} * {number(error_budget(slo))})"
    parts = [f"    max({labels_selector(SLI_RECORD.format(w), labels)} > {threshold})"
             " without (sloth_window)" for w in (window.short, window.long)]
    return "(\n" + "\n    and\n".join(parts) + "\n)"


def _percent(ratio: float) -> str:
    """0.9995 -> "99.95" (Sloth's `sloth_objective`)."""
    return f"{ratio * 100:.10g}"
