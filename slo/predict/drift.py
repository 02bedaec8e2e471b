"""Drift of the live latency model, judged as requests finish: when the p90 coverage of
its recent TTFT predictions falls below what the alert calls healthy, a retrain should
not wait for the schedule. The retrain itself still goes through the holdout gate
(`slo.predict.accuracy.judge`): drift only makes it come sooner.
"""

from __future__ import annotations

from collections import deque

from observe import registry as R
from observe.record import RequestRecord
from slo.predict.accuracy import judge_served

DRIFT_WINDOW = 200  # the newest judged TTFT predictions of the live model
DRIFT_MIN_JUDGED = 100  # fewer say too little to act on
DRIFT_COOLDOWN_S = 600.0  # at most one drift retrain per ten minutes


class DriftWatch:
    """Coverage of the live model's TTFT p90 over its newest judged requests."""

    def __init__(self, min_coverage: float = R.PREDICTION_COVERAGE_MIN,
                 window: int = DRIFT_WINDOW, min_judged: int = DRIFT_MIN_JUDGED,
                 cooldown_s: float = DRIFT_COOLDOWN_S):
        self.min_coverage, self.min_judged = min_coverage, min_judged
        self.cooldown_s = cooldown_s
        self._covered: deque[bool] = deque(maxlen=window)
        self._hits = 0  # covered ones in the window: O(1) per request on the event loop
        self._version: str | None = None
        self._last_trigger: float | None = None

    def coverage(self) -> float | None:
        return self._hits / len(self._covered) if self._covered else None

    def _add(self, covered: bool) -> None:
        if len(self._covered) == self._covered.maxlen:
            self._hits -= self._covered[0]
        self._covered.append(covered)
        self._hits += covered

    def _reset(self) -> None:
        self._covered.clear()
        self._hits = 0

    def observe(self, rec: RequestRecord, now: float) -> bool:
        """Count one finished request; True when the model has drifted and a retrain
        is due now (then the window starts afresh)."""
        ttft = [j for j in judge_served(rec)
                if j.target == "ttft_s" and j.within_p90 is not None]
        if not ttft:
            return False
        if rec.prediction.version != self._version:  # a new model is judged on its own
            self._reset()
            self._version = rec.prediction.version
        self._add(ttft[0].within_p90)
        if len(self._covered) < self.min_judged or self.coverage() >= self.min_coverage:
            return False
        if self._last_trigger is not None and now - self._last_trigger < self.cooldown_s:
            return False
        self._last_trigger = now
        self._reset()
        return True
