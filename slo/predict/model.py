"""Per-request latency prediction at admission: TTFT and TPOT, median and p90.

Two models answer the same `predict()`:
- `SeedModel`: seed 003's TTFT formula `50 + 0.05*ctx + 2e-6*ctx^2` ms and seed 002's
  per-token decode time by context bucket. It knows nothing of load; it is what the
  server predicts with until it has trained a model, and the baseline to beat.
- `LatencyModel`: quantile gradient boosting (scikit-learn HistGradientBoosting,
  quantile loss) on log latency, trained from the trace log, compiled to numpy
  (`slo.predict.forest`). Quantiles commute with log, so the p50 of log TTFT is the p50 of TTFT,
  and errors in log space are relative errors, which is how accuracy is judged.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from observe import registry as R
from slo import model_files
from slo.predict.features import FEATURES, TrainingSet, design
from slo.predict.forest import Forest, compile_forest

QUANTILES: Final = (0.5, 0.9)
SEED_VERSION: Final = "seed-003"
# Seed 002's per-token decode time by context bucket (SPEC §5).
SEED_TPOT_S: Final = {"0-1k": 0.002, "1k-4k": 0.003, "4k-32k": 0.005, "32k+": 0.005}
# Models: (target, quantile) in this order; outputs of `predict` follow it.
OUTPUTS: Final = tuple((target, q) for target in ("ttft_s", "tpot_s") for q in QUANTILES)
MIN_ROWS: Final = 200
FORMAT: Final = 1
KIND: Final = "latency model"


def seed_ttft_s(prompt_tokens: float) -> float:
    ctx = float(prompt_tokens)
    return (50 + 0.05 * ctx + 2e-6 * ctx * ctx) / 1000


class SeedModel:
    version = SEED_VERSION

    def predict(self, x) -> np.ndarray:
        """(ttft p50, ttft p90, tpot p50, tpot p90) for one feature row; a point
        estimate, so both quantiles are the same."""
        ttft = seed_ttft_s(x[0])
        tpot = SEED_TPOT_S[R.context_bucket(int(x[0]))]
        return np.array([ttft, ttft, tpot, tpot])

    def predict_many(self, X: np.ndarray) -> np.ndarray:
        return np.array([self.predict(row) for row in X]).reshape(len(X), 4)


@dataclass(frozen=True, slots=True)
class LatencyModel:
    forest: Forest
    features: tuple[str, ...]
    window: tuple[float, float]  # epoch seconds of the oldest and newest training row
    rows: int
    trained_at: float = field(default_factory=time.time)
    version: str = field(default_factory=lambda: "hgb-" + uuid.uuid4().hex[:8])

    def predict(self, x) -> np.ndarray:
        return self.predict_many(np.asarray(x, dtype=np.float64)[None, :])[0]

    def predict_many(self, X: np.ndarray) -> np.ndarray:
        """Rows of (ttft p50, ttft p90, tpot p50, tpot p90); separately fitted quantile
        models can cross, so a p90 is never let below its p50."""
        out = np.exp(self.forest.predict(design(np.asarray(X, dtype=np.float64))))
        out[:, 1] = np.maximum(out[:, 1], out[:, 0])
        out[:, 3] = np.maximum(out[:, 3], out[:, 2])
        return out

    def save(self, path: str | Path) -> Path:
        return model_files.save(self, path, KIND, FORMAT)

    def describe(self) -> dict:
        return {"version": self.version, "rows": self.rows, "features": list(self.features),
                "window": list(self.window), "trained_at": self.trained_at}


def load_model(path: str | Path) -> LatencyModel:
    model = model_files.load(path, KIND, FORMAT)
    if tuple(model.features) != FEATURES:
        raise ValueError(f"{path}: trained on features {model.features}, expected {FEATURES}")
    return model


def train(data: TrainingSet, max_iter: int = 200, seed: int = 0) -> LatencyModel:
    """Fit the four quantile models; TPOT only on requests that made two tokens."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    if len(data) < MIN_ROWS:
        raise ValueError(f"need at least {MIN_ROWS} served requests to train, have {len(data)}")
    estimators = []
    for target, q in OUTPUTS:
        y = getattr(data, target)
        keep = np.isfinite(y) & (y > 0)
        est = HistGradientBoostingRegressor(
            loss="quantile", quantile=q, max_iter=max_iter, learning_rate=0.08,
            max_depth=8, min_samples_leaf=10, l2_regularization=1.0,
            early_stopping=False, random_state=seed)
        est.fit(design(data.X[keep]), np.log(y[keep]))
        estimators.append(est)
    return LatencyModel(compile_forest(estimators), FEATURES, data.window, len(data))


def e2e_s(ttft_s: float, tpot_s: float, max_tokens: int) -> float:
    """Predicted end-to-end time if the request runs to its max_tokens."""
    return ttft_s + tpot_s * max(0, max_tokens - 1)

