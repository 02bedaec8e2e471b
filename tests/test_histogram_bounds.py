"""Latency histogram bounds from the SLO spec (slo/histogram_bounds.py): pinned to the
shipped spec's targets and series counts, the instruments built with them, and the
benchmark's Prometheus quantile against hand-computed cases."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from bench.serving.histogram_bounds import histogram_quantile
from observe import registry as R
from observe.metrics import RequestMetrics, create_prometheus_export
from slo.histogram_bounds import (
    MAX_BOUNDS,
    derived_bounds,
    grid_ratio,
    latency_buckets,
    series_per_replica,
    target_values,
)
from slo.loading import load_spec
from slo.targets import ContextTarget, FixedTarget, TableTarget

SPEC = load_spec()


def test_a_context_target_gives_its_values_at_the_context_bucket_edges():
    # 0.2 s up to 1024 tokens; 0.5 x (1 + log2(ctx / 1024)) above: 0.5 just past it,
    # 1.5 at 4096, 3.0 at 32768
    values = target_values(ContextTarget(0.2, 0.5, 1024))
    assert {0.2, 0.5, 1.5, 3.0} <= values
    assert all(0.2 <= v <= 3.0001 for v in values)
    assert target_values(FixedTarget(0.05)) == {0.05}
    assert target_values(TableTarget(((4096, 0.3), (None, 0.8)))) == {0.3, 0.8}


def test_slo_bounds_hold_every_target_of_their_histogram_and_at_most_forty():
    buckets = latency_buckets(SPEC, "slo")
    for name, bounds in buckets.items():
        assert len(bounds) <= MAX_BOUNDS
        assert list(bounds) == sorted(set(bounds)), name
    ttft = buckets[R.TTFT.prom_name]
    assert {0.2, 0.3, 0.5, 0.8, 1.5, 3.0} <= set(ttft)  # ttft and first_token_health
    assert 2.0 in buckets[R.E2E.prom_name]
    assert 0.05 in buckets[R.TPOT.prom_name]
    assert grid_ratio(buckets[R.DECODE.prom_name]) < 1.35  # no targets: the grid alone


def test_fine_is_the_registrys_and_slo_is_a_quarter_of_its_series():
    fine = latency_buckets(SPEC, "fine")
    assert fine[R.TTFT.prom_name] == R.LATENCY_BUCKETS_S
    assert series_per_replica(fine) == 5224  # 5 x (213 + 3) x 4 + 2 x (110 + 3) x 4
    assert series_per_replica(latency_buckets(SPEC, "slo")) == 1204


def test_an_unknown_choice_is_refused_by_name():
    with pytest.raises(ValueError, match="histogram buckets must be one of fine, slo"):
        latency_buckets(SPEC, "coarse")


def test_grid_bounds_next_to_a_target_give_way_to_it():
    bounds = derived_bounds([0.2], 0.1, 0.4, total=5)  # grid 0.1, 0.159, 0.252, 0.4
    assert bounds == (0.1, 0.159, 0.2, 0.252, 0.4)
    # 0.1 is within 5% of the target: dropped, and the grid refined to use the budget
    assert derived_bounds([0.1005], 0.1, 0.4, total=3) == (0.1005, 0.2, 0.4)


def test_the_server_histograms_count_at_the_target_bounds():
    registry = CollectorRegistry()
    export = create_prometheus_export(registry)
    buckets = latency_buckets(SPEC, "slo")
    metrics = RequestMetrics(export.provider.get_meter("test"), buckets)
    ttft = metrics.instruments[R.TTFT.prom_name]
    for value in (0.2, 0.2000001, 0.19):
        ttft.record(value, {R.LABEL_CONTEXT_BUCKET: "0-1k"})
    samples = {s.labels["le"]: s.value for family in registry.collect() for s in family.samples
               if s.name == R.TTFT.prom_name + "_bucket" and s.labels["context_bucket"] == "0-1k"}
    assert len(samples) == len(buckets[R.TTFT.prom_name]) + 1
    assert samples["0.2"] == 2.0  # met the 0.2 s target: counted exactly, le is inclusive
    assert samples["+Inf"] == 3.0
    export.shutdown()


@pytest.mark.parametrize("values, expected", [
    ([0.5] * 100, 0.5),  # all in (0.1, 1]: rank 99 of 100 -> 0.1 + 0.9 x 0.99
    ([0.05] * 50 + [5.0] * 50, 1.0),  # rank in +Inf: the highest finite bound
    ([0.05] * 99 + [0.5], 0.1),  # rank 99 falls on the first bucket's last count
])
def test_the_bench_quantile_is_prometheus_histogram_quantile(values, expected):
    got = histogram_quantile(0.99, (0.1, 1.0), values)
    if expected == 0.5:
        expected = 0.1 + 0.9 * 0.99
    assert got == pytest.approx(expected)
