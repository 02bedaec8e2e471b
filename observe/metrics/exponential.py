"""Prometheus native (exponential) histogram buckets, as client_golang counts them.

A native histogram of schema `s` has bucket `i` cover (2^((i-1)/2^s), 2^(i/2^s)]: each
bound 2^(1/2^s) times the last (schema 3: 1.0905, client_golang's default "factor
1.1"), as many buckets as the data reach, and Prometheus keeps the whole histogram as
one series per label set, where a classic one makes a series per bound. Values at or
under `ZERO_THRESHOLD` go to the zero bucket.

`Exponential` keeps one label set's sparse counts; `spans_and_deltas` is the
exposition's encoding of them; `quantile` is what Prometheus 2.42 (Debian's) answers
for `histogram_quantile` over such a histogram (linear inside the bucket), so a bench
can give its error without a Prometheus server (`tests/test_native_histograms.py`
holds it to a real one).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from functools import lru_cache
from typing import Final

SCHEMA: Final = 3  # bounds 2^(1/8) = 1.0905 apart: P99 within 9% at worst
ZERO_THRESHOLD: Final = 2.0 ** -128  # client_golang's default: only a true 0 falls in


@lru_cache(maxsize=None)
def _fractions(schema: int) -> tuple[float, ...]:
    """client_golang's `nativeHistogramBounds[schema]`: the bounds of one power of two
    as frexp fractions, 0.5 up to (not including) 1."""
    per_octave = 1 << schema
    return tuple(0.5 * 2.0 ** (j / per_octave) for j in range(per_octave))


def bucket_index(value: float, schema: int = SCHEMA) -> int:
    """The bucket of a positive value: its upper bound 2^(index/2^schema) is the first
    at or over it (a bound is inclusive, as in classic histograms)."""
    fraction, exponent = math.frexp(value)
    if schema > 0:
        bounds = _fractions(schema)
        return bisect_left(bounds, fraction) + (exponent - 1) * len(bounds)
    index = exponent - (1 if fraction == 0.5 else 0)  # an exact power of two
    return (index + (1 << -schema) - 1) >> -schema


def upper_bound(index: int, schema: int = SCHEMA) -> float:
    return 2.0 ** (index / (1 << schema)) if schema > 0 else 2.0 ** (index << -schema)


class Exponential:
    """One label set's native histogram: sparse bucket counts and the zero bucket."""

    __slots__ = ("schema", "counts", "zero")

    def __init__(self, schema: int = SCHEMA):
        self.schema = schema
        self.counts: dict[int, int] = {}
        self.zero = 0

    def observe(self, value: float) -> None:
        if value <= ZERO_THRESHOLD:
            self.zero += 1
            return
        index = bucket_index(value, self.schema)
        counts = self.counts
        counts[index] = counts.get(index, 0) + 1

    def copy(self) -> "Exponential":
        twin = Exponential(self.schema)
        twin.counts, twin.zero = dict(self.counts), self.zero
        return twin


def spans_and_deltas(counts: dict[int, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """The exposition's sparse form: spans of consecutive buckets as (offset from the
    end of the last span, or the first index, length), and each bucket's count as a
    delta from the bucket before it (the first from 0)."""
    spans: list[tuple[int, int]] = []
    deltas: list[int] = []
    previous_index, previous_count = None, 0
    for index in sorted(counts):
        if previous_index is not None and index == previous_index + 1:
            offset, length = spans[-1]
            spans[-1] = (offset, length + 1)
        else:
            gap = index if previous_index is None else index - previous_index - 1
            spans.append((gap, 1))
        deltas.append(counts[index] - previous_count)
        previous_index, previous_count = index, counts[index]
    return spans, deltas


def quantile(q: float, histogram: Exponential) -> float:
    """Prometheus 2.42's `histogram_quantile` of one native histogram (promql
    `histogramQuantile`): the bucket where the rank falls, linear inside it; the zero
    bucket spans [0, threshold] when only positive buckets exist. NaN when empty."""
    total = histogram.zero + sum(histogram.counts.values())
    if total == 0:
        return math.nan
    rank = q * total
    buckets = [(0.0, ZERO_THRESHOLD, histogram.zero)] if histogram.zero else []
    schema = histogram.schema
    buckets += [(upper_bound(i - 1, schema), upper_bound(i, schema), histogram.counts[i])
                for i in sorted(histogram.counts)]
    seen = 0
    for lower, upper, count in buckets:
        seen += count
        if seen >= rank:
            return lower + (upper - lower) * ((rank - (seen - count)) / count)
    return buckets[-1][1]
