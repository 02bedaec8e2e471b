"""The live latency predictor: predicts each request at admission and retrains
itself from the trace log on a schedule, off the event loop.

It starts with the saved model beside the trace DB if there is one, else the seed
formula; a retrain replaces the model in one assignment, so a request is predicted
by one model or the other, never half of each.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from pathlib import Path

from observe.stats import AdmissionLoad, LatencyPrediction
from serving.periodic import Periodic
from slo.features import TrainingSet, feature_vector, training_sql
from slo.predictor import MIN_ROWS, SeedModel, e2e_s, load_model, train

log = logging.getLogger("tailguard.predict")
TRAINING_ROWS_MAX = 200_000


class PredictionService:
    def __init__(self, tracelog, model_path: Path | None, retrain_interval_s: float = 600.0,
                 window_s: float = 6 * 3600.0):
        self.tracelog = tracelog
        self.model_path = model_path
        self.retrain_interval_s = retrain_interval_s
        self.window_s = window_s
        self.model = self._initial_model()
        self.last_error: str | None = None
        self._periodic: Periodic | None = None

    def _initial_model(self):
        if self.model_path and self.model_path.exists():
            try:
                model = load_model(self.model_path)
                log.info("latency model %s loaded from %s", model.version, self.model_path)
                return model
            except (ValueError, OSError, EOFError) as exc:
                log.warning("ignoring latency model %s: %s", self.model_path, exc)
        return SeedModel()

    def predict(self, prompt_tokens: int, max_tokens: int | None, load: AdmissionLoad,
                batch: bool, tokenize_s: float = 0.0) -> LatencyPrediction:
        model = self.model  # one model for the whole prediction, even mid-swap
        max_tokens = max_tokens or 16
        ttft, ttft90, tpot, tpot90 = model.predict(
            feature_vector(prompt_tokens, max_tokens, load, batch, tokenize_s)).tolist()
        return LatencyPrediction(ttft, ttft90, tpot, tpot90, e2e_s(ttft, tpot, max_tokens),
                                 model.version)

    # --- retraining ----------------------------------------------------------------

    def start(self) -> None:
        self._periodic = Periodic("tailguard-retrain", self.retrain_interval_s, self.retrain)
        self._periodic.start()

    def retrain(self) -> dict:
        """Train on the recent window; keep the old model when there is too little data."""
        started = time.monotonic()
        try:
            data = self._training_set()
            if len(data) < MIN_ROWS:
                return {"trained": False, "rows": len(data), "needed": MIN_ROWS}
            from threadpoolctl import threadpool_limits

            with threadpool_limits(1):  # leave the other cores to serving
                model = train(data)
            if self.model_path:
                model.save(self.model_path)
            self.model = model
            self.last_error = None
            log.info("latency model %s trained on %d requests in %.1f s", model.version,
                     len(data), time.monotonic() - started)
            return {"trained": True, **model.describe()}
        except Exception as exc:  # a failed retrain must never take serving down
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("retraining the latency model failed")
            return {"trained": False, "error": self.last_error}

    def _training_set(self) -> TrainingSet:
        self.tracelog.flush()
        since = datetime.fromtimestamp(time.time() - self.window_s, tz=timezone.utc)
        result = self.tracelog.query(training_sql(since.isoformat()),
                                     max_rows=TRAINING_ROWS_MAX, timeout_s=60)
        return TrainingSet.from_rows(result.rows)

    def describe(self) -> dict:
        model = self.model
        info = model.describe() if hasattr(model, "describe") else {"version": model.version}
        return {**info, "retrain_interval_s": self.retrain_interval_s,
                "model_path": str(self.model_path) if self.model_path else None,
                "last_error": self.last_error}

    def stop(self) -> None:
        if self._periodic is not None:
            self._periodic.stop()
