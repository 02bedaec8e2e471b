"""Engine statistics as a regular time series: what memory forecasters learn from.

`engine_stats` has a row per second while the server runs. Forecasting 5 minutes
ahead second by second is noise, so rows are averaged into `step_s` buckets (5 s by
default: the 5-minute horizon is 60 steps). Gaps (the server was down) are carried
forward, never interpolated from the future.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

# Columns of engine_stats a forecaster may read. A bucket averages its rows; a row
# covers one second, so token, request and preemption counts become per-second rates.
COLUMNS: Final = ("kv_cache_usage", "rss_bytes", "running", "waiting", "prompt_tokens",
                  "generation_tokens", "finished", "preemptions")
TARGETS: Final = ("kv_cache_usage", "rss_bytes")
DEFAULT_STEP_S: Final = 5.0
DEFAULT_HORIZON_S: Final = 300.0


def series_sql(since_epoch: float | None = None) -> str:
    cols = ", ".join(f"coalesce({name}, 0)" for name in COLUMNS)
    where = f" WHERE epoch(ts) >= {float(since_epoch)}" if since_epoch is not None else ""
    return f"SELECT epoch(ts), {cols} FROM engine_stats{where} ORDER BY ts"


@dataclass(frozen=True, slots=True)
class Series:
    """Columns of COLUMNS on a regular grid of `step_s` seconds from `start`."""

    start: float  # epoch seconds of the first bucket
    step_s: float
    values: np.ndarray  # (steps, len(COLUMNS))

    def __len__(self) -> int:
        return len(self.values)

    def column(self, name: str) -> np.ndarray:
        return self.values[:, _index(name)]

    def head(self, stop: int) -> "Series":
        return Series(self.start, self.step_s, self.values[:stop])

    def tail(self, steps: int) -> "Series":
        skip = max(0, len(self) - steps)
        return Series(self.start + skip * self.step_s, self.step_s, self.values[skip:])

    @classmethod
    def from_rows(cls, rows, step_s: float = DEFAULT_STEP_S) -> "Series":
        """Rows of `series_sql` (epoch seconds first), any order."""
        data = np.array(rows, dtype=np.float64).reshape(len(rows), len(COLUMNS) + 1)
        if not len(data):
            return cls(0.0, step_s, np.zeros((0, len(COLUMNS))))
        data = data[np.argsort(data[:, 0])]
        start = float(np.floor(data[0, 0] / step_s) * step_s)
        bucket = ((data[:, 0] - start) // step_s).astype(np.int64)
        steps = int(bucket[-1]) + 1
        counts = np.bincount(bucket, minlength=steps)
        values = np.zeros((steps, len(COLUMNS)))
        for j in range(len(COLUMNS)):
            sums = np.bincount(bucket, weights=data[:, j + 1], minlength=steps)
            values[:, j] = np.divide(sums, counts, out=np.zeros(steps), where=counts > 0)
        return cls(start, step_s, _carry_forward(values, counts > 0))


def _carry_forward(values: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Buckets with no row take the last seen bucket's values."""
    idx = np.where(seen, np.arange(len(seen)), 0)
    np.maximum.accumulate(idx, out=idx)
    return values[idx]


def _index(name: str) -> int:
    if name not in COLUMNS:
        raise KeyError(f"unknown series column {name!r}")
    return COLUMNS.index(name)


def horizon_steps(horizon_s: float, step_s: float) -> int:
    steps = int(round(horizon_s / step_s))
    if steps < 1:
        raise ValueError("the horizon must be at least one step")
    return steps
