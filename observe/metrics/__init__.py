"""The registry's metrics: instruments (`instruments`), kept natively where Prometheus
is the only reader (`native`), through OpenTelemetry's SDK where OTLP reads them too."""

from observe.metrics.instruments import (
    MetricsExport,
    RequestMetrics,
    create_instrument,
    create_instruments,
    create_prometheus_export,
)

__all__ = ["MetricsExport", "RequestMetrics", "create_instrument", "create_instruments",
           "create_prometheus_export"]
