"""Small PromQL builders shared by the SLO and operational rules.

Every metric name, label name and label value comes from `observe.registry`. The
OpenTelemetry exporter adds `otel_scope_*` labels to every series, so each
expression aggregates with `sum`/`max by (...)`.
"""

from __future__ import annotations

from observe import registry as R


def selector(metric: str, **matchers: str) -> str:
    """`metric{a="x",b="y"}` with matchers in the order given."""
    inner = ",".join(f'{key}="{value}"' for key, value in matchers.items())
    return f"{metric}{{{inner}}}"


def labels_selector(metric: str, labels: dict[str, str]) -> str:
    """Sloth's style for recorded series: `metric{a="x", b="y"}`, keys sorted."""
    inner = ", ".join(f'{key}="{labels[key]}"' for key in sorted(labels))
    return f"{metric}{{{inner}}}"


def label_value(label: str) -> str:
    """Alert templating's value of `label`: `{{ $labels.label }}`."""
    return "{{ $labels." + label + " }}"


def sli_error_ratio(job: str, slo: str, window: str, by: tuple[str, ...] = ()) -> str:
    """Share of bad events among all events of `slo` over `window`.

    A counter series appears only after its first increment, so a service that has
    never had a bad event has no `result="bad"` series: `or 0 * total` turns that
    into a ratio of 0 instead of no value. No traffic at all gives no value (not
    NaN), so period averages skip idle time instead of being poisoned by it.
    """
    metric = R.SLO_REQUESTS.prom_name
    agg = f"sum by ({', '.join(by)}) " if by else "sum"
    every = selector(metric, job=job, **{R.LABEL_SLO: slo})
    bad = selector(metric, job=job, **{R.LABEL_SLO: slo, R.LABEL_RESULT: R.RESULT_BAD})
    total = f"{agg}(rate({every}[{window}]))"
    return (f"(\n  {agg}(rate({bad}[{window}]))\n  or\n  0 * {total}\n)\n"
            f"/\n({total} > 0)\n")


def period_average(record: str, labels: dict[str, str], window: str) -> str:
    """Sloth's period SLI: the mean of the 5m ratio over the period (cheap to evaluate)."""
    series = labels_selector(record, labels)
    return (f"sum_over_time({series}[{window}])\n/ ignoring ({R.LABEL_SLOTH_WINDOW})\n"
            f"count_over_time({series}[{window}])\n")


def number(value: float) -> str:
    """A float as PromQL/YAML text, shortest form that round-trips (14.4, 0.01, 1)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text
