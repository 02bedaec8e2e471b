"""The native instruments' families as Prometheus reads them: prometheus_client's
objects (for `collect()`), the text exposition written directly (what
`generate_latest` writes, about 13x faster), and the protobuf one
(`observe.metrics.protobuf`) with a histogram's native buckets beside its classic ones.
"""

from __future__ import annotations

from itertools import accumulate

from observe.metrics import protobuf as P

_SCOPE_LABELS = ("otel_scope_name", "otel_scope_schema_url", "otel_scope_version")


def _label_names(instrument) -> list[str]:
    """Every label a series of `instrument` shows (an unset one as ""), sorted."""
    return sorted(set(instrument._labels) | set(_SCOPE_LABELS))


def _scope(instrument) -> dict[str, str]:
    """The `otel_scope_*` labels the SDK's exporter adds to every series."""
    return {"otel_scope_name": instrument.scope, "otel_scope_schema_url": "",
            "otel_scope_version": ""}


def _series_labels(instrument, scope: dict[str, str], key: tuple[str, ...]) -> dict[str, str]:
    """One series' labels: the scope's, then the instrument's own from its key."""
    return {**scope, **dict(zip(instrument._labels, key))}


def _shown_name(metric) -> str:
    """The family's name as exposed: a counter's ends in `_total`."""
    name = metric.prom_name
    return f"{name.removesuffix('_total')}_total" if metric.kind == "counter" else name


def client_family(instrument, samples):
    """One instrument as the prometheus_client family its `collect()` yields."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    metric = instrument.metric
    names, scope = _label_names(instrument), _scope(instrument)
    factory = {"histogram": HistogramMetricFamily, "counter": CounterMetricFamily,
               "gauge": GaugeMetricFamily}[metric.kind]
    family = factory(metric.prom_name, metric.description, labels=names)
    for key, value in samples:
        labels = _series_labels(instrument, scope, key)
        row = [labels.get(name, "") for name in names]
        if metric.kind == "histogram":
            family.add_metric(row, _buckets(metric.buckets, value[1:]), value[0])
        else:
            family.add_metric(row, value[0])
    return family


def render(instrument, samples, out: list[str]) -> None:
    """One family as `generate_latest` writes it (labels sorted by name, `le` among
    them; values as Go formats floats)."""
    from prometheus_client.openmetrics.exposition import ALLOWUTF8, _escape
    from prometheus_client.utils import floatToGoString

    metric = instrument.metric
    kind, name = metric.kind, metric.prom_name
    shown = _shown_name(metric)
    help_text = metric.description.replace("\\", r"\\").replace("\n", r"\n")
    out.append(f"# HELP {shown} {help_text}\n# TYPE {shown} {kind}\n")
    names, scope = _label_names(instrument), _scope(instrument)
    for key, value in samples:
        labels = _series_labels(instrument, scope, key)
        pairs = [(k, f'{k}="{_escape(labels.get(k, ""), ALLOWUTF8, False)}"') for k in names]
        if kind != "histogram":
            out.append(f"{shown}{{{','.join(p for _, p in pairs)}}} {floatToGoString(value[0])}\n")
            continue
        before = "".join(f"{p}," for k, p in pairs if k < "le")
        after = "".join(f",{p}" for k, p in pairs if k > "le")
        total = 0
        for bound, count in zip([*metric.buckets, "+Inf"], value[1:]):
            total += count
            out.append(f'{name}_bucket{{{before}le="{bound}"{after}}} {_go(total)}\n')
        plain = ",".join(p for _, p in pairs)
        out.append(f"{name}_count{{{plain}}} {_go(total)}\n"
                   f"{name}_sum{{{plain}}} {floatToGoString(value[0])}\n")


def protobuf_family(instrument) -> bytes:
    """One family in the protobuf exposition: the same series, labels and values as
    `render` writes, a histogram's native buckets beside its classic ones."""
    metric = instrument.metric
    kind = metric.kind
    names, scope = _label_names(instrument), _scope(instrument)
    samples = (instrument.snapshot() if kind == "histogram"
               else [(key, value, None) for key, value in instrument.samples()])
    rows = []
    for key, value, exponential in samples:
        labels = _series_labels(instrument, scope, key)
        pairs = P.labels((k, labels.get(k, "")) for k in names)
        if kind == "histogram":
            cumulative = list(accumulate(value[1:]))  # the last is +Inf's: the count
            finite = list(zip(metric.buckets, cumulative))
            rows.append(P.histogram(pairs, cumulative[-1], value[0], finite, exponential))
        else:
            rows.append((P.counter if kind == "counter" else P.gauge)(pairs, value[0]))
    code = {"histogram": P.HISTOGRAM, "counter": P.COUNTER, "gauge": P.GAUGE}[kind]
    return P.family(_shown_name(metric), metric.description, code, rows)


def _go(count: int) -> str:
    """An integer count as `floatToGoString` writes it (5 -> 5.0; 1e6 up in e-form)."""
    if count < 1_000_000:
        return f"{count}.0"
    from prometheus_client.utils import floatToGoString

    return floatToGoString(count)


def _buckets(bounds, counts) -> list[tuple[str, int]]:
    """Cumulative (le, count) pairs, `le` formatted as the OpenTelemetry exporter does."""
    out, total = [], 0
    for bound, count in zip([*bounds, "+Inf"], counts):  # a bound as given: 16, 0.5
        total += count
        out.append((f"{bound}", total))
    return out
