"""Latency histogram bounds derived from the SLO spec, for a fleet that cannot afford
`fine` ones (issue 21 §4).

`fine` (the default, CONTRACT's "10 ms-resolution P99"): 213 bounds on every
seconds-scale histogram and 110 on the per-token ones, so each latency histogram is
about 215 series per context bucket, 4,000-5,000 per replica for the seven of them.
`slo`: at most `MAX_BOUNDS` bounds: one at every target the spec's SLOs judge that
histogram's quantity against (so `le="<target>"` counts exactly what met it), the rest
log-spaced over the histogram's range, so a quantile's interpolation error is a fixed
share of its value wherever it falls. A target that varies with the context length
(seed 003's) contributes its two bases and its values at the context buckets' edges.

What each choice costs in series and in P99 error against the trace log's exact P99:
`python -m bench.serving.histogram_bounds` (docs/benchmarks.md).
"""

from __future__ import annotations

import math
from typing import Final

from observe import registry as R
from slo.spec import SLOSpec
from slo.targets import ContextTarget, FixedTarget, TableTarget

CHOICES: Final = ("fine", "slo")
MAX_BOUNDS: Final = 40
# (low, high) of the log-spaced part: the fine bounds' own range.
SECONDS_RANGE: Final = (0.001, 60.0)
PER_TOKEN_RANGE: Final = (0.0001, 2.5)
# A grid bound this close to a target (as a ratio) is left out: the target stands for it.
NEAR: Final = 1.05
# Which SLIs' targets belong on which histogram.
TARGETS_OF: Final = {R.TTFT.prom_name: ("ttft",), R.E2E.prom_name: ("e2e",),
                     R.TPOT.prom_name: ("tpot",), R.QUEUE.prom_name: ("ttft",),
                     R.PREFILL.prom_name: ("ttft",)}
PER_TOKEN: Final = frozenset({R.TPOT.prom_name, R.SAMPLING.prom_name})


def target_values(target, edges=R.CONTEXT_BUCKET_BOUNDS) -> set[float]:
    """The distinct thresholds a target applies: a fixed or stepped target's own, a
    context-dependent one's bases and its values at the context buckets' edges."""
    if isinstance(target, FixedTarget):
        return {target.seconds}
    if isinstance(target, TableTarget):
        return {seconds for _, seconds in target.steps}
    if isinstance(target, ContextTarget):  # its two bases, and its value at each edge
        return ({target.short_base_s, target.long_base_s}
                | {round(target(n), 6) for n in edges})
    return set()


def spec_targets(spec: SLOSpec, slis: tuple[str, ...]) -> list[float]:
    values: set[float] = set()
    for slo in spec.slos:
        if slo.sli in slis and slo.target is not None:
            values |= target_values(slo.target)
    return sorted(values)


def derived_bounds(targets: list[float], low: float, high: float,
                   total: int = MAX_BOUNDS) -> tuple[float, ...]:
    """`targets` (those inside the range) plus log-spaced bounds from `low` to `high`,
    `total` at most; grid bounds within `NEAR` of a target give way to it, and the grid
    is made finer until the budget is used."""
    kept = sorted({t for t in targets if low <= t <= high})[:total]
    best = tuple(kept)
    for grid_count in range(total - len(kept), total + 1):
        bounds = set(kept)
        if grid_count >= 2:
            ratio = (high / low) ** (1 / (grid_count - 1))
            for i in range(grid_count):
                bound = float(f"{low * ratio ** i:.3g}")
                if all(max(bound, t) / min(bound, t) > NEAR for t in kept):
                    bounds.add(bound)
        if len(best) < len(bounds) <= total:  # the shifted grid may drop more or fewer
            best = tuple(sorted(bounds))
    return best


def latency_buckets(spec: SLOSpec, choice: str = "fine") -> dict[str, tuple[float, ...]]:
    """Bounds per latency histogram (Prometheus name) for `choice`; `fine` is the
    registry's own."""
    if choice not in CHOICES:
        raise ValueError(f"histogram buckets must be one of {', '.join(CHOICES)}, "
                         f"got {choice!r}")
    if choice == "fine":
        return {m.prom_name: m.buckets for m in R.LATENCY_METRICS}
    out = {}
    for metric in R.LATENCY_METRICS:
        low, high = PER_TOKEN_RANGE if metric.prom_name in PER_TOKEN else SECONDS_RANGE
        targets = spec_targets(spec, TARGETS_OF.get(metric.prom_name, ()))
        out[metric.prom_name] = derived_bounds(targets, low, high)
    return out


def series_per_replica(buckets: dict[str, tuple[float, ...]],
                       context_buckets: int = len(R.CONTEXT_BUCKETS)) -> int:
    """Series the latency histograms make: per context bucket, one per bound, +Inf,
    _sum and _count."""
    return sum((len(bounds) + 3) * context_buckets for bounds in buckets.values())


def grid_ratio(bounds: tuple[float, ...]) -> float:
    """The widest step between neighbouring bounds, as a ratio (what bounds a
    quantile's relative error)."""
    return max(b / a for a, b in zip(bounds, bounds[1:])) if len(bounds) > 1 else math.inf
