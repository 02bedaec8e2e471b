"""Online calibration of the queue estimate: the engine model's TTFT estimate made at
admission (`slo.policy.feasibility`) against the TTFT each request then had.

The estimate is a physical model (work ahead at the engine's measured speed), so it
is right from a fresh server's first steps, but it is a point figure: it knows
nothing of tokenizing jitter, the event loop or the engine loop picking a request
up. The ratios of actual to estimated TTFT of served requests turn it into calibrated
quantiles: p50 = estimate x median ratio, p90 = estimate x 90th-percentile ratio.

How far off the estimate is depends on its size: a 50 ms estimate misses by the
engine loop's jitter, a 5 s one by how the queue ahead of it moved. So the ratios are
kept per band of estimate (`BANDS_S`, the newest `WINDOW` each), and an estimate is
calibrated by its own band's once it holds `MIN_SAMPLES`; before that, by the newest
`RECENT` ratios of any band; before `MIN_SAMPLES` of those, the priors hold. Chosen
on two 5x surges (seeds 1 and 2) where policies were off, then on, on one server: one
window of the newest 500 let the off half's queue ratios (about 2x) inflate the on
half's small estimates, TTFT p50 error 39-63% against 16% per band
(docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
from collections import deque

BANDS_S = (0.25, 1.0)  # upper bounds of the estimate bands (s); the last is open
WINDOW = 200
RECENT = 100
MIN_SAMPLES = 30
PRIOR_P50 = 1.0
PRIOR_P90 = 1.5
REFRESH_EVERY = 10  # re-sort a window every this many samples (cheap on the loop)


class RatioWindow:
    """The newest ratios of actual to estimated TTFT, and their p50 and p90."""

    __slots__ = ("ratios", "p50", "p90", "_since_refresh")

    def __init__(self, size: int):
        self.ratios: deque[float] = deque(maxlen=size)
        self.p50, self.p90 = PRIOR_P50, PRIOR_P90
        self._since_refresh = 0

    def add(self, ratio: float) -> None:
        self.ratios.append(ratio)
        self._since_refresh += 1
        if self.ready and self._since_refresh >= REFRESH_EVERY:
            ranked = sorted(self.ratios)
            self.p50 = ranked[(len(ranked) - 1) // 2]
            self.p90 = max(self.p50, ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))])
            self._since_refresh = 0

    @property
    def ready(self) -> bool:
        return len(self.ratios) >= MIN_SAMPLES

    def describe(self) -> dict:
        return {"samples": len(self.ratios), "p50_ratio": self.p50, "p90_ratio": self.p90}


class QueueCalibration:
    def __init__(self, bands_s: tuple[float, ...] = BANDS_S, window: int = WINDOW,
                 recent: int = RECENT):
        self.bands_s = bands_s
        self._bands = [RatioWindow(window) for _ in range(len(bands_s) + 1)]
        self._recent = RatioWindow(recent)
        self.seen = 0

    def observe(self, ttft_s: float | None, estimate_s: float | None) -> None:
        """One served request: its TTFT and the estimate made at its admission."""
        if not ttft_s or not estimate_s or ttft_s <= 0 or estimate_s <= 0:
            return
        ratio = ttft_s / estimate_s
        self.seen += 1
        self._band(estimate_s).add(ratio)
        self._recent.add(ratio)

    def quantiles(self, estimate_s: float) -> tuple[float, float]:
        """(p50, p90) TTFT for an estimate."""
        band = self._band(estimate_s)
        source = band if band.ready else self._recent
        return estimate_s * source.p50, estimate_s * source.p90

    def _band(self, estimate_s: float) -> RatioWindow:
        return self._bands[bisect.bisect_left(self.bands_s, estimate_s)]

    def describe(self) -> dict:
        bounds = [*self.bands_s, None]
        return {"samples": self.seen, "recent": self._recent.describe(),
                "bands": [{"up_to_s": bound, **band.describe()}
                          for bound, band in zip(bounds, self._bands)]}
