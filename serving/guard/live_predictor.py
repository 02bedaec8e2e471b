"""The live latency predictor: predicts each request at admission and retrains
itself from the trace log on a schedule, off the event loop.

It starts with the saved model beside the trace DB if there is one, else the seed
formula. A retrain trains a candidate on all but the newest 20% of the window and
replaces the live model, in one assignment, only if the candidate beats it on that
newest 20% (`slo.predict.accuracy.judge`); either way the decision is returned, kept for
`describe()` and audited as a `policy_events` row. A scheduled retrain whose live model
already meets the prediction goals on that newest 20% keeps it without fitting a
candidate (`slo.predict.accuracy.within_goals`: a fit costs seconds of a core beside
the engine, and could only edge it). A candidate is fitted in a child process at
the lowest CPU priority (`slo.predict.fit_process`). A retrain comes early when the live
model drifts (`slo.predict.drift`: its TTFT p90 coverage falls under 80%). A request is
predicted by one model or the other, never half of each.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from observe import registry as R
from observe.record import AdmissionLoad, LatencyPrediction, RequestRecord
from serving.guard.periodic import Periodic
from slo.predict.accuracy import (GATE_EVENT, HOLDOUT_SHARE, Verdict, accuracy, judge,
                                  scores, within_goals)
from slo.predict.calibration import QueueCalibration
from slo.predict.drift import DriftWatch
from slo.predict.features import TrainingSet, feature_vector, training_sql
from slo.predict.fit_process import fit_apart
from slo.predict.model import MIN_ROWS, SeedModel, e2e_s, load_model

QUEUE_VERSION = "engine-queue"  # TTFT from the live engine model's queue estimate

log = logging.getLogger("tailguard.predict")
TRAINING_ROWS_MAX = 200_000
# Enough rows that the part trained on still has MIN_ROWS once the holdout is set aside.
MIN_RETRAIN_ROWS = math.ceil(MIN_ROWS / (1 - HOLDOUT_SHARE))


class PredictionService:
    def __init__(self, tracelog, model_path: Path | None, retrain_interval_s: float = 600.0,
                 window_s: float = 6 * 3600.0):
        self.tracelog = tracelog
        self.model_path = model_path
        self.retrain_interval_s = retrain_interval_s
        self.window_s = window_s
        self.model = self._initial_model()
        self.last_error: str | None = None
        self.last_decision: dict | None = None  # the last retrain gate decision
        self._retrain_lock = threading.Lock()
        self._periodic: Periodic | None = None
        self.drift = DriftWatch()
        self.calibration = QueueCalibration()

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
                batch: bool, tokenize_s: float = 0.0,
                queue_ttft_s: float | None = None) -> LatencyPrediction:
        """`queue_ttft_s`: the engine model's TTFT estimate (from arrival) made by the
        deadline check, without its allowance for VIPs still to come (the record's
        `ttft_expected_s`: the calibration learns from the same). Until a trained model
        is live, TTFT comes from it, calibrated online, rather than from the seed
        formula, which knows no queue."""
        model = self.model  # one model for the whole prediction, even mid-swap
        max_tokens = max_tokens or 16
        ttft, ttft90, tpot, tpot90 = model.predict(
            feature_vector(prompt_tokens, max_tokens, load, batch, tokenize_s)).tolist()
        version = model.version
        if queue_ttft_s is not None and isinstance(model, SeedModel):
            ttft, ttft90 = self.calibration.quantiles(queue_ttft_s)
            version = QUEUE_VERSION
        return LatencyPrediction(ttft, ttft90, tpot, tpot90, e2e_s(ttft, tpot, max_tokens),
                                 version)

    # --- retraining ----------------------------------------------------------------

    def start(self) -> None:
        self._periodic = Periodic("tailguard-retrain", self.retrain_interval_s, self.retrain)
        self._periodic.start()

    def on_request(self, rec: RequestRecord) -> None:
        """A finished request (observer listener): when the live model has drifted, a
        retrain on a thread of its own, through the same gate; never with retraining
        off (interval 0), never two at once. Every served request also calibrates the
        queue estimate."""
        if rec.status == R.STATUS_OK:
            self.calibration.observe(rec.ttft_s, rec.ttft_expected_s)
        if self.drift.observe(rec, time.monotonic()) and self.retrain_interval_s > 0 \
                and not self._retrain_lock.locked():
            log.warning("latency model %s drifted: TTFT p90 coverage under %.0f%%; "
                        "retraining now", rec.prediction.version,
                        self.drift.min_coverage * 100)
            threading.Thread(target=self.retrain, args=("drift",), name="tailguard-drift",
                             daemon=True).start()

    def retrain(self, trigger: str = "periodic") -> dict:
        """Train a candidate on the recent window less its newest HOLDOUT_SHARE and make
        it live only if it beats the live model on that held-out share (`judge`)."""
        try:
            with self._retrain_lock:  # one decision at a time, against the model live now
                data = self._training_set()
                if len(data) < MIN_RETRAIN_ROWS:
                    return {"trained": False, "rows": len(data), "needed": MIN_RETRAIN_ROWS}
                return self._decide(*data.split(HOLDOUT_SHARE), trigger)
        except Exception as exc:  # a failed retrain must never take serving down
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("retraining the latency model failed")
            return {"trained": False, "error": self.last_error}

    def _decide(self, fit: TrainingSet, holdout: TrainingSet, trigger: str) -> dict:
        started, live = time.monotonic(), self.model
        live_accuracy = accuracy(live, holdout)
        kept = within_goals(live_accuracy) if trigger == "periodic" else None
        if kept is not None:  # the schedule's fit would buy nothing: spare its CPU
            candidate, verdict = None, Verdict(False, kept, {}, scores(live_accuracy))
        else:
            candidate = fit_apart(fit)
            verdict = judge(accuracy(candidate, holdout), live_accuracy)
        if verdict.accepted:
            if self.model_path:
                candidate.save(self.model_path)
            self.model = candidate
        self.last_error = None
        self.last_decision = {
            "trained": candidate is not None, "accepted": verdict.accepted,
            "reason": verdict.reason, "trigger": trigger, "decided_at": time.time(),
            "version": self.model.version, "training_rows": len(fit),
            "holdout_rows": len(holdout), "holdout_window": list(holdout.window),
            "candidate": verdict.candidate, "live": verdict.live}
        self._audit(live.version, self.last_decision)
        log.info("latency model %s %s in %.1f s", (candidate or live).version, verdict.reason,
                 time.monotonic() - started)
        return {**self.last_decision, **(self.describe_model() if verdict.accepted else {})}

    def _audit(self, was: str, decision: dict) -> None:
        """One `policy_events` row per decision, written through at once."""
        if self.tracelog is None:
            return
        details = {k: v for k, v in decision.items() if k not in ("reason", "decided_at")}
        self.tracelog.add("policy_events", {
            "ts": datetime.fromtimestamp(decision["decided_at"], tz=timezone.utc),
            "policy": GATE_EVENT, "from_state": was, "to_state": decision["version"],
            "reason": decision["reason"], "details": details})
        self.tracelog.flush()

    def _training_set(self) -> TrainingSet:
        self.tracelog.flush()
        since = datetime.fromtimestamp(time.time() - self.window_s, tz=timezone.utc)
        result = self.tracelog.query(training_sql(since.isoformat()),
                                     max_rows=TRAINING_ROWS_MAX, timeout_s=60)
        return TrainingSet.from_rows(result.rows)

    def describe_model(self) -> dict:
        model = self.model
        return model.describe() if hasattr(model, "describe") else {"version": model.version}

    def describe(self) -> dict:
        return {**self.describe_model(), "retrain_interval_s": self.retrain_interval_s,
                "model_path": str(self.model_path) if self.model_path else None,
                "last_error": self.last_error, "last_retrain": self.last_decision}

    def stop(self) -> None:
        if self._periodic is not None:
            self._periodic.stop()

