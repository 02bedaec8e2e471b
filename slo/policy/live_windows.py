"""In-memory sliding windows the policy engine reads once a second (never SQL on a
tick): latency samples per context bucket, outcomes, engine busy time, and the
KV cache's trend (`time_to_full`).

Each window keeps (time, value) pairs for `span_s` seconds in a deque; adding is
O(1), and a P99 sorts at most the window's samples once per evaluation.
"""

from __future__ import annotations

import math
from collections import deque


class SampleWindow:
    """Values seen in the last `span_s` seconds."""

    def __init__(self, span_s: float):
        self.span_s = span_s
        self._items: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> None:
        self._items.append((now, value))

    def _trim(self, now: float) -> None:
        edge = now - self.span_s
        items = self._items
        while items and items[0][0] < edge:
            items.popleft()

    def values(self, now: float, span_s: float | None = None) -> list[float]:
        self._trim(now)
        if span_s is None or span_s >= self.span_s:
            return [v for _, v in self._items]
        edge = now - span_s
        return [v for t, v in self._items if t >= edge]

    def points(self, now: float) -> list[tuple[float, float]]:
        """(time, value) pairs, oldest first."""
        self._trim(now)
        return list(self._items)

    def count(self, now: float) -> int:
        self._trim(now)
        return len(self._items)

    def total(self, now: float) -> float:
        self._trim(now)
        return sum(v for _, v in self._items)


def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (what an SRE computes by hand); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    # the rank is ceil(q*n); q*n in floating point can land a hair above a whole
    # number (0.07 * 100 = 7.000000000000001), which must not add a rank
    rank = math.ceil(round(q * len(ordered), 9))
    return ordered[min(len(ordered) - 1, max(0, rank - 1))]


class OutcomeWindow:
    """Requests finished in the last `span_s` seconds: count and 5xx share."""

    def __init__(self, span_s: float):
        self._window = SampleWindow(span_s)

    def add(self, now: float, error: bool) -> None:
        self._window.add(now, 1.0 if error else 0.0)

    def error_rate(self, now: float) -> float:
        values = self._window.values(now)
        return sum(values) / len(values) if values else 0.0

    def count(self, now: float) -> int:
        return self._window.count(now)


MIN_TREND_POINTS = 5  # a slope from fewer seconds is noise
MIN_RISE_PER_S = 1e-4  # slower than 0.01% a second (over 2.7 h to fill) is flat


def time_to_full(points: list[tuple[float, float]], full: float = 1.0) -> float | None:
    """Seconds until `full` at the trend of `points` ((time, usage) pairs): the least
    squares slope, from the newest measured usage; 0 when already full; None when the
    trend is flat, falling, or there are too few points to tell."""
    if len(points) < MIN_TREND_POINTS:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / spread
    if slope < MIN_RISE_PER_S:
        return None
    return max(0.0, (full - points[-1][1]) / slope)

