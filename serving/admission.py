"""Admission: what happens to a request between the HTTP layer and the engine.

For now it stamps each request with the load it meets and its predicted latency;
the degradation policies' per-request decisions (token caps, truncation, shedding,
lanes) belong here too, since this is the last point before the engine.
"""

from __future__ import annotations

import time

from observe import registry as R
from observe.stats import RequestRecord
from serving.load import LoadTracker
from serving.prediction import PredictionService


class Admission:
    def __init__(self, load: LoadTracker, predictor: PredictionService):
        self.load = load
        self.predictor = predictor

    def admit(self, rec: RequestRecord, prompt_tokens: int, max_tokens: int | None) -> None:
        """Called once per engine request; a multi-prompt completion is judged by its
        first prompt's load and prediction."""
        load = self.load.admit(prompt_tokens)
        if rec.load is None:
            rec.load = load
            rec.prediction = self.predictor.predict(
                prompt_tokens, max_tokens, load, rec.priority == R.PRIORITY_BATCH,
                time.monotonic() - rec.arrival)

    def release(self, prompt_tokens: int) -> None:
        """The request has its first token, or left without one."""
        self.load.release(prompt_tokens)
