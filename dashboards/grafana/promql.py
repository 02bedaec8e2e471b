"""PromQL for the dashboards, built from registry metrics.

Every selector of a tailguard metric sits directly inside `sum by (...)`: the
OpenTelemetry Prometheus exporter adds labels of its own (`otel_scope_name`,
`otel_scope_version`, ...) and Prometheus adds `job`/`instance`, so a panel that
read raw series would split or double its lines. (Sloth's recording rules are read
in `sloth.py`.)
"""

from __future__ import annotations

from observe.registry import LATENCY_METRICS, MetricDef

RATE_INTERVAL = "$__rate_interval"
QUANTILES = (0.5, 0.95, 0.99)


def matchers(**labels: str) -> str:
    """`{a="x", b=~"y"}` from keyword arguments; a value starting with `~` is a regex."""
    parts = []
    for name, value in labels.items():
        op, value = ("=~", value[1:]) if value.startswith("~") else ("=", value)
        parts.append(f'{name}{op}"{value}"')
    return "{" + ", ".join(parts) + "}" if parts else ""


def summed(name: str, by: tuple[str, ...], selector: str = "", fn: str = "",
           window: str = RATE_INTERVAL) -> str:
    """`sum by (by) (fn(name{selector}[window]))`, or of the bare gauge without `fn`."""
    inner = f"{fn}({name}{selector}[{window}])" if fn else f"{name}{selector}"
    return f"sum by ({', '.join(by)}) ({inner})"


def rate(metric: MetricDef, by: tuple[str, ...], selector: str = "") -> str:
    """Per-second rate of a counter, summed by `by`."""
    return summed(metric.prom_name, by, selector, "rate")


def gauge(metric: MetricDef, by: tuple[str, ...], selector: str = "") -> str:
    return summed(metric.prom_name, by, selector)


def quantile(q: float, metric: MetricDef, by: tuple[str, ...], selector: str = "") -> str:
    """The q-quantile of a histogram over the rate interval, one series per `by`; of a
    latency histogram's native form where Prometheus keeps that instead of buckets
    (`serve --native-histograms`, Prometheus with its native-histograms feature)."""
    buckets = summed(f"{metric.prom_name}_bucket", ("le",) + by, selector, "rate")
    classic = f"histogram_quantile({q}, {buckets})"
    if metric not in LATENCY_METRICS:
        return classic
    native = (summed(metric.prom_name, by, selector, "rate") if by
              else f"sum(rate({metric.prom_name}{selector}[{RATE_INTERVAL}]))")
    return f"{classic} or histogram_quantile({q}, {native})"


def bucket_counts(metric: MetricDef, selector: str = "") -> str:
    """Observations per histogram bucket over the rate interval (a heatmap's input),
    from a latency histogram's native form too (Grafana draws its buckets)."""
    classic = summed(f"{metric.prom_name}_bucket", ("le",), selector, "increase")
    if metric not in LATENCY_METRICS:
        return classic
    return f"{classic} or sum(increase({metric.prom_name}{selector}[{RATE_INTERVAL}]))"


def mean(metric: MetricDef, by: tuple[str, ...], selector: str = "") -> str:
    """Mean observation of a histogram over the rate interval."""
    total = summed(f"{metric.prom_name}_sum", by, selector, "rate")
    count = summed(f"{metric.prom_name}_count", by, selector, "rate")
    return f"{total} / {count}"


def percentile_legend(q: float) -> str:
    """`p99` for 0.99, `p50` for 0.5."""
    return f"p{q * 100:g}"
