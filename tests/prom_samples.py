"""Exact values read back from a fresh Prometheus registry (prometheus_client's style
of metric tests): the registry's instruments over their own CollectorRegistry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry

from observe.metrics import RequestMetrics, create_prometheus_export


@contextmanager
def fresh_metrics() -> Iterator[tuple[RequestMetrics, CollectorRegistry]]:
    registry = CollectorRegistry()
    export = create_prometheus_export(registry)
    try:
        yield RequestMetrics(export.provider.get_meter("test")), registry
    finally:
        export.shutdown()


def sample_value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """The value of the one sample `name` whose labels include `labels` (the exporter
    adds scope labels of its own), or None."""
    for family in registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None
