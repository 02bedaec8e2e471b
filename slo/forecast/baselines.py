"""Baseline memory forecasters, the bar the LSTM must clear.

Each forecaster answers the same question: given the series up to and including step
`t`, what is the target at `t + horizon`? `forecast(series, origins)` answers it for
many origins at once; every computation is causal (a recursion that runs forward, or
lags that end at `t`), so an origin never sees its own future. `fit` may only look at
the series it is given, which the backtest cuts at the training boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from slo.forecast.series import Series

ALPHAS = (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)
DAMPINGS = (0.8, 0.9, 0.95, 0.98)


class Forecaster(Protocol):
    name: str

    def fit(self, series: Series, target: str, horizon: int) -> "Forecaster": ...

    def forecast(self, series: Series, origins: np.ndarray) -> np.ndarray: ...


def training_origins(length: int, horizon: int, first: int = 0) -> np.ndarray:
    """Origins whose target lies inside a series of `length` steps."""
    return np.arange(first, max(first, length - horizon))


@dataclass(slots=True)
class LastValue:
    name: str = "last_value"
    target: str = ""

    def fit(self, series: Series, target: str, horizon: int) -> "LastValue":
        self.target = target
        return self

    def forecast(self, series: Series, origins: np.ndarray) -> np.ndarray:
        return series.column(self.target)[origins]


@dataclass(slots=True)
class EWMA:
    """Exponentially weighted level; alpha picked on the training data."""

    name: str = "ewma"
    target: str = ""
    alpha: float = 0.2

    def fit(self, series: Series, target: str, horizon: int) -> "EWMA":
        self.target = target
        y = series.column(target)
        origins = training_origins(len(y), horizon)
        self.alpha = min(ALPHAS, key=lambda a: _mae(_ewma(y, a)[origins], y[origins + horizon]))
        return self

    def forecast(self, series: Series, origins: np.ndarray) -> np.ndarray:
        return _ewma(series.column(self.target), self.alpha)[origins]


@dataclass(slots=True)
class Holt:
    """Exponential smoothing with a damped additive trend (ETS(A,Ad,N))."""

    name: str = "ets"
    target: str = ""
    horizon: int = 1
    params: tuple[float, float, float] = (0.2, 0.05, 0.9)

    def fit(self, series: Series, target: str, horizon: int) -> "Holt":
        self.target, self.horizon = target, horizon
        y = series.column(target)
        origins = training_origins(len(y), horizon)
        grid = [(a, b, phi) for a in ALPHAS for b in (0.01, 0.05, 0.2) for phi in DAMPINGS]
        self.params = min(grid, key=lambda p: _mae(self._path(y, p)[origins],
                                                   y[origins + horizon]))
        return self

    def _path(self, y: np.ndarray, params) -> np.ndarray:
        alpha, beta, phi = params
        level, trend = y[0], 0.0
        ahead = sum(phi ** k for k in range(1, self.horizon + 1))
        out = np.empty(len(y))
        for t, value in enumerate(y):
            previous = level
            level = alpha * value + (1 - alpha) * (level + phi * trend)
            trend = beta * (level - previous) + (1 - beta) * phi * trend
            out[t] = level + ahead * trend
        return out

    def forecast(self, series: Series, origins: np.ndarray) -> np.ndarray:
        return self._path(series.column(self.target), self.params)[origins]


@dataclass(slots=True)
class RidgeLags:
    """Linear regression of the value `horizon` steps ahead on the last `lags`
    values (closed-form ridge, intercept unpenalised)."""

    name: str = "ridge_lags"
    target: str = ""
    lags: int = 60
    penalty: float = 1.0
    horizon: int = 1
    coef: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def fit(self, series: Series, target: str, horizon: int) -> "RidgeLags":
        self.target, self.horizon = target, horizon
        y = series.column(target)
        origins = training_origins(len(y), horizon, first=self.lags - 1)
        if not len(origins):
            raise ValueError(f"ridge_lags needs more than {self.lags + horizon} steps")
        X = self._design(y, origins)
        reg = self.penalty * np.eye(X.shape[1])
        reg[0, 0] = 0.0
        self.coef = np.linalg.solve(X.T @ X + reg, X.T @ y[origins + horizon])
        return self

    def _design(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        padded = np.concatenate([np.full(self.lags - 1, y[0]), y])  # early origins
        cols = [padded[origins + self.lags - 1 - k] for k in range(self.lags)]
        return np.column_stack([np.ones(len(origins)), *cols])

    def forecast(self, series: Series, origins: np.ndarray) -> np.ndarray:
        return self._design(series.column(self.target), origins) @ self.coef


def _ewma(y: np.ndarray, alpha: float) -> np.ndarray:
    out = np.empty(len(y))
    level = y[0] if len(y) else 0.0
    for t, value in enumerate(y):
        level += alpha * (value - level)
        out[t] = level
    return out


def _mae(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - actual))) if len(actual) else float("inf")


def baselines() -> list[Forecaster]:
    return [LastValue(), EWMA(), Holt(), RidgeLags()]
