"""Rolling-origin backtests of memory forecasters: which one earns its place.

The series is cut at `train_share`; every later step is a forecast origin. Each model
is refitted every `refit_every` origins on everything before the origin (expanding
window) and judged by its absolute error at the horizon. The winner is whichever has
the lowest MAE: the LSTM has to earn its place against the baselines every time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Final

import numpy as np

from slo.forecast.baselines import Forecaster, baselines
from slo.forecast.series import Series, horizon_steps

BOUNDS: Final = {"kv_cache_usage": (0.0, 1.0), "rss_bytes": (0.0, np.inf)}
log = logging.getLogger("tailguard.forecast")


def all_forecasters(seed: int = 0) -> list[Forecaster]:
    """The baselines and the LSTM (its members trained from seeds seed, seed+1, ...)."""
    from slo.forecast.lstm import LSTMForecaster

    return [*baselines(), LSTMForecaster(seed=seed)]


@dataclass(frozen=True, slots=True)
class Score:
    name: str
    mae: float
    rmse: float
    origins: int
    fit_s: float  # total fitting time over the refits


@dataclass(frozen=True, slots=True)
class Backtest:
    target: str
    horizon_s: float
    step_s: float
    train_steps: int
    scores: tuple[Score, ...]  # best first

    @property
    def winner(self) -> Score:
        return self.scores[0]

    def score(self, name: str) -> Score | None:
        return next((s for s in self.scores if s.name == name), None)

    def margin(self) -> float | None:
        """Winner's MAE relative to the runner-up (0.8: 20% lower error)."""
        if len(self.scores) < 2 or not self.scores[1].mae:
            return None
        return self.winner.mae / self.scores[1].mae

    def describe(self) -> dict:
        return {"target": self.target, "horizon_s": self.horizon_s, "step_s": self.step_s,
                "train_steps": self.train_steps, "winner": self.winner.name,
                "margin_vs_runner_up": self.margin(),
                "scores": [_plain(s) for s in self.scores]}

    def table(self) -> str:
        """The scores as `tailguard forecast eval/train` prints them, best first."""
        last = self.score("last_value")
        lines = [f"{self.target}, {self.horizon_s:.0f} s ahead, {self.step_s:g} s steps, "
                 f"{self.winner.origins} origins after {self.train_steps} training steps",
                 f"{'model':<12} {'MAE':>10} {'RMSE':>10} {'vs last':>8} {'fit s':>7}"]
        for s in self.scores:
            ratio = f"{s.mae / last.mae:.3f}" if last and last.mae else "-"
            lines.append(f"{s.name:<12} {s.mae:>10.4g} {s.rmse:>10.4g} {ratio:>8} "
                         f"{s.fit_s:>7.1f}")
        margin = self.margin()
        lines.append(f"winner: {self.winner.name}" + (
            f" ({1 - margin:.1%} lower MAE than the runner-up)" if margin is not None else ""))
        return "\n".join(lines)


def _plain(score: Score) -> dict:
    return {k: getattr(score, k) for k in Score.__slots__}


def backtest(series: Series, target: str, horizon_s: float = 300.0, train_share: float = 0.6,
             refit_every: int = 60,
             factory: Callable[[], list[Forecaster]] = all_forecasters) -> Backtest:
    h = horizon_steps(horizon_s, series.step_s)
    train_steps = int(len(series) * train_share)
    origins = np.arange(train_steps, len(series) - h)
    if len(origins) < 1:
        raise ValueError(f"series of {len(series)} steps is too short to backtest a "
                         f"{horizon_s:.0f} s horizon")
    actual = series.column(target)[origins + h]
    scores = []
    for model in factory():
        try:
            scores.append(_score(model, series, target, h, origins, actual, refit_every))
        except ValueError as exc:  # e.g. too little history for this model: skip it
            log.warning("backtest: %s skipped: %s", model.name, exc)
    if not scores:
        raise ValueError(f"no model can be fitted on {train_steps} training steps")
    scores.sort(key=lambda s: s.mae)
    return Backtest(target, horizon_s, series.step_s, train_steps, tuple(scores))


def _score(model: Forecaster, series, target, h, origins, actual, refit_every) -> Score:
    preds, fit_s = np.empty(len(origins)), 0.0
    for start in range(0, len(origins), refit_every):
        chunk = origins[start:start + refit_every]
        began = time.perf_counter()
        model.fit(series.head(int(chunk[0]) + 1), target, h)
        fit_s += time.perf_counter() - began
        preds[start:start + len(chunk)] = clip(target, model.forecast(series, chunk))
    err = preds - actual
    return Score(model.name, float(np.mean(np.abs(err))), float(np.sqrt(np.mean(err ** 2))),
                 len(origins), fit_s)


def clip(target: str, values: np.ndarray) -> np.ndarray:
    low, high = BOUNDS.get(target, (-np.inf, np.inf))
    return np.clip(values, low, high)
