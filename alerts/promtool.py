"""Helpers for promtool unit tests: series notation, expected alerts, running promtool.

promtool 2.42 (Debian) compares sample values exactly and annotations as rendered
text, so expectations are built the way Prometheus renders them: Go's `%v` for
`{{ $value }}`, `%.4g` for `humanizePercentage` and (1 s - 60 s) `humanizeDuration`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from alerts.promql import number

INSTANCE = "tailguard:8000"


def series(metric: str, job: str, **labels: str) -> str:
    """A test series as Prometheus stores a scrape of the OTel exporter: job, instance,
    the exporter's scope label (which the rules must aggregate away), then ours."""
    merged = {"job": job, "instance": INSTANCE, "otel_scope_name": "tailguard", **labels}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in merged.items()) + "}"


def counter_values(increments: list[float]) -> str:
    """promtool's expanding notation for a counter starting at 0 that grows by
    `increments[i]` in minute i+1: runs of equal steps become `start+stepxN`."""
    values = [0.0]
    for inc in increments:
        values.append(values[-1] + inc)
    return _runs(values)


def gauge_values(values: list[float]) -> str:
    return _runs([float(v) for v in values])


def _runs(values: list[float]) -> str:
    parts, i = [], 0
    while i < len(values):
        j = i + 1
        step = values[j] - values[i] if j < len(values) else 0.0
        while j + 1 < len(values) and _close(values[j + 1] - values[j], step):
            j += 1
        if j < len(values):
            parts.append(f"{_num(values[i])}{_signed(step)}x{j - i}")
        else:
            parts.append(_num(values[i]))
        i = j + 1
    return " ".join(parts)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _num(value: float) -> str:
    return number(round(value, 6))


def _signed(step: float) -> str:
    text = _num(step)
    return text if text.startswith("-") else "+" + text


_TEMPLATE = re.compile(r"\{\{ \$(labels\.(\w+)|value)(?: \| (\w+))? \}\}")


def expand(template: str, labels: dict[str, str], value: float | None = None) -> str:
    """Render the subset of Prometheus alert templating the rules use."""
    def one(match: re.Match) -> str:
        if match.group(2):
            return labels[match.group(2)]
        return _humanize(value, match.group(3))

    return _TEMPLATE.sub(one, template)


def _humanize(value: float, how: str | None) -> str:
    if how is None:
        return number(value)
    if how == "humanizePercentage":
        return f"{value * 100:.4g}%"
    if how == "humanizeDuration" and 1 <= value < 60:
        return f"{value:.4g}s"
    raise ValueError(f"cannot render {how} of {value} for a test expectation")


def expected_alert(rule: dict, labels: dict[str, str], value: float | None = None) -> dict:
    """promtool's `exp_alerts` entry for `rule` firing with result `labels` and `value`."""
    all_labels = {**labels, **rule["labels"]}
    return {"exp_labels": dict(sorted(all_labels.items())),
            "exp_annotations": {k: expand(v, all_labels, value)
                                for k, v in rule["annotations"].items()}}


def promtool(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run promtool (Debian's `prometheus` package); FileNotFoundError if absent."""
    exe = shutil.which("promtool")
    if exe is None:
        raise FileNotFoundError("promtool not found: install Debian's prometheus package"
                                " (scripts/system-deps.sh)")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
