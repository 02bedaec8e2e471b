"""The memory forecaster the server runs: the backtest's winner, refitted on the whole
series, saved beside the trace DB and loaded by the live forecast."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from slo import model_files
from slo.forecast.backtest import Backtest, all_forecasters, backtest, clip
from slo.forecast.baselines import Forecaster
from slo.forecast.series import Series, horizon_steps

FORMAT: Final = 1
KIND: Final = "memory forecaster"


@dataclass(slots=True)
class MemoryForecaster:
    """The backtest's winner, refitted on the whole series: what the server runs."""

    model: Forecaster
    target: str
    horizon_s: float
    step_s: float
    backtest: Backtest
    fitted_at: float = field(default_factory=time.time)

    @classmethod
    def select(cls, series: Series, target: str, horizon_s: float = 300.0,
               **kwargs) -> "MemoryForecaster":
        result = backtest(series, target, horizon_s, **kwargs)
        winner = next(m for m in kwargs.get("factory", all_forecasters)()
                      if m.name == result.winner.name)
        winner.fit(series, target, horizon_steps(horizon_s, series.step_s))
        return cls(winner, target, horizon_s, series.step_s, result)

    def forecast_latest(self, series: Series) -> float:
        """The target `horizon_s` after the series' last step."""
        return float(clip(self.target, self.model.forecast(series, np.array([len(series) - 1])))[0])

    def save(self, path: str | Path) -> Path:
        return model_files.save(self, path, KIND, FORMAT)


def load_forecaster(path: str | Path) -> MemoryForecaster:
    return model_files.load(path, KIND, FORMAT)
