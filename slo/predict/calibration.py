"""Online calibration of the queue estimate: the engine model's TTFT estimate made at
admission (`slo.policy.feasibility`) against the TTFT each request then had.

The estimate is a physical model (work ahead at the engine's measured speed), so it
is right from a fresh server's first steps, but it is a point figure: it knows
nothing of tokenizing jitter, the event loop or the engine loop picking a request
up. The ratios of actual to estimated TTFT over the newest `WINDOW` served requests
turn it into calibrated quantiles: p50 = estimate x median ratio, p90 = estimate x
90th-percentile ratio. Until `MIN_SAMPLES` requests have been served, the priors
(measured on a recording, docs/policies.md) hold.
"""

from __future__ import annotations

from collections import deque

WINDOW = 500
MIN_SAMPLES = 30
PRIOR_P50 = 1.0
PRIOR_P90 = 1.5
REFRESH_EVERY = 25  # re-sort the window every this many samples (cheap on the loop)


class QueueCalibration:
    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES):
        self._ratios: deque[float] = deque(maxlen=window)
        self.min_samples = min_samples
        self.p50, self.p90 = PRIOR_P50, PRIOR_P90
        self._since_refresh = 0

    def observe(self, ttft_s: float | None, estimate_s: float | None) -> None:
        """One served request: its TTFT and the estimate made at its admission."""
        if not ttft_s or not estimate_s or ttft_s <= 0 or estimate_s <= 0:
            return
        self._ratios.append(ttft_s / estimate_s)
        self._since_refresh += 1
        if len(self._ratios) >= self.min_samples and self._since_refresh >= REFRESH_EVERY:
            self._refresh()

    def _refresh(self) -> None:
        ranked = sorted(self._ratios)
        self.p50 = ranked[(len(ranked) - 1) // 2]
        self.p90 = max(self.p50, ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))])
        self._since_refresh = 0

    def quantiles(self, estimate_s: float) -> tuple[float, float]:
        """(p50, p90) TTFT for an estimate."""
        return estimate_s * self.p50, estimate_s * self.p90

    def describe(self) -> dict:
        return {"samples": len(self._ratios), "p50_ratio": self.p50, "p90_ratio": self.p90}
