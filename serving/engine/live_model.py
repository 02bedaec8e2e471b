"""The engine model, calibrated live from the step probe: what admission's deadline
check (`slo.policy.feasibility`) and the breaker's off-model signal read.

The same `EngineModel` that `replay` and the simulator fit from a trace log, fitted
here (by relative error: short steps matter as much as long ones to a short
prompt's deadline) on the newest `WINDOW_STEPS` engine steps every `REFIT_S`
(warm-up's steps count,
so a fresh server is calibrated before its first request). Until `MIN_STEPS` steps
have been seen it is the shipped prior: the embedded model on a 2-core CPU box,
measured (`docs/policies.md`).
The token budget is the engine's own `max_num_batched_tokens`, the per-request chunk cap
its `long_prefill_token_threshold` (and whether it is adaptive), read from the engine's
configuration once it has started (`engine_limits`).

Its `overhead_s` is what a request spends after the deadline check outside the engine
steps it estimated (the engine loop picking the request up, its first output coming
back): learned as the median, over the newest `OVERHEAD_WINDOW` requests judged with
nothing ahead of them, of their TTFT less the estimate's engine part
(`RequestRecord.engine_ttft_s`). What came before the check (HTTP, tokenizing) has
passed already when the check runs, and is not counted twice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace

import numpy as np

from observe import registry as R
from observe.stats import StepRecord
from slo.sim.engine_model import EngineModel, fit_steps

WINDOW_STEPS = 2000  # about a minute of steps under load
# The warm-up's steps (prompts from 64 tokens to the model's length, ~30 steps) are
# enough for a first fit: a fresh server estimates with its own engine's speed.
MIN_STEPS = 24
REFIT_S = 5.0
OVERHEAD_WINDOW = 200
OVERHEAD_MIN = 20  # samples before the learned overhead replaces the prior's
OVERHEAD_EVERY = 10  # recomputed every this many samples
# The prior: the step terms of `EngineModel` fitted (`slo.sim.engine_model.calibrate`,
# R^2 0.96) on the 6,481 steps of a 60 s 5x surge of the embedded model (both sides of
# `bench.policy.surge --seed 2 --factors 5 --rate 1.6`, float32) on a 2-core CPU box
# (vLLM 0.32 CPU backend), 2026-12-03; KV capacity from the 5x surge of 2026-12-02
# (48 MiB KV cache); see docs/policies.md. The overhead after the check: the median
# over the requests that found an idle engine in a 3x design surge (seed 441, the
# 2-vCPU AMX Xeon, 2026-12-07), until the server has learned its own.
PRIOR = EngineModel(step_base_s=0.00595, step_per_seq_s=0.000462, step_per_token_s=7.15e-5,
                    step_per_pair_s=6.42e-8, token_budget=2048, kv_capacity_tokens=27_564,
                    overhead_s=0.0063)


class LiveEngineModel:
    def __init__(self, prior: EngineModel = PRIOR, token_budget: int | None = None):
        self._steps: deque[tuple[float, int, int, int]] = deque(maxlen=WINDOW_STEPS)
        self._lock = threading.Lock()
        self._seen = 0
        self._fitted_at_seen = 0
        self._refit_at = 0.0
        self.prior = prior
        self.model = _with_limits(prior, token_budget)
        self.last_step_end = 0.0  # monotonic
        self._pending_since: float | None = None  # work has waited since (monotonic)
        self._overheads: deque[float] = deque(maxlen=OVERHEAD_WINDOW)

    def set_engine_limits(self, token_budget: int, chunk_cap: int = 0,
                          kv_capacity_tokens: int = 0, cap_adaptive: bool = False) -> None:
        """The engine's max_num_batched_tokens, long_prefill_token_threshold (adaptive
        or not) and KV-cache size in tokens (known once it has started; 0: keep the
        prior's)."""
        limits = (token_budget, chunk_cap, kv_capacity_tokens, cap_adaptive)
        self.model = _with_limits(self.model, *limits)
        self.prior = _with_limits(self.prior, *limits)

    def on_step(self, step: StepRecord) -> None:
        """Ledger consumer, run as the step is drained (on the event loop or the
        ledger's thread, under the ledger's lock)."""
        with self._lock:
            self._steps.append((step.duration_s, len(step.request_ids), step.scheduled_tokens,
                                step.attention_pairs))
            self._seen += 1
        self.last_step_end = step.start + step.duration_s

    def refit(self, now: float | None = None) -> EngineModel:
        """Refit when due and there are new steps; the model in force either way."""
        now = time.monotonic() if now is None else now
        if now < self._refit_at or self._seen == self._fitted_at_seen:
            return self.model
        with self._lock:
            if len(self._steps) < MIN_STEPS:
                return self.model
            data = np.array(self._steps, dtype=float)
            self._fitted_at_seen = self._seen
        self._refit_at = now + REFIT_S
        coef, r2 = fit_steps(*data.T, relative=True)
        if coef[0] <= 0:  # a degenerate window (all steps alike): keep what we had
            return self.model
        self.model = EngineModel(*map(float, coef), token_budget=self.model.token_budget,
                                 prefill_chunk_cap=self.model.prefill_chunk_cap,
                                 prefill_cap_adaptive=self.model.prefill_cap_adaptive,
                                 kv_capacity_tokens=self.prior.kv_capacity_tokens,
                                 overhead_s=self.model.overhead_s, steps_fitted=len(data),
                                 fit_r2=r2)
        return self.model

    def on_request(self, rec) -> None:
        """A finished request (observer listener): one judged with nothing ahead of it
        and served is a sample of the overhead after the check."""
        if rec.engine_ttft_s is None or rec.ttft_s is None or rec.status != R.STATUS_OK:
            return
        self._overheads.append(rec.ttft_s - rec.engine_ttft_s)
        if len(self._overheads) >= OVERHEAD_MIN and len(self._overheads) % OVERHEAD_EVERY == 0:
            self.model = replace(self.model,
                                 overhead_s=max(0.0, float(np.median(self._overheads))))

    def describe(self) -> dict:
        """The model in force (JSON-safe) and where it comes from."""
        out = {k: (None if isinstance(v, float) and v != v else v)
               for k, v in self.model.describe().items()}
        return {**out, "source": "live" if self.model.steps_fitted else "prior",
                "steps_seen": self._seen}

    def since_last_step_s(self, now: float) -> float | None:
        """Seconds since the engine's last step ended (None before its first)."""
        return now - self.last_step_end if self.last_step_end else None

    def stalled_s(self, now: float, pending: bool) -> float:
        """Seconds the engine has taken no step while work waits for it: since its last
        step or since the work began to wait (an engine idle for a minute is not
        stalled when a request arrives), whichever is later; 0 with nothing waiting.
        Called once a tick: the start of the wait is known to a tick."""
        if not pending:
            self._pending_since = None
            return 0.0
        if self._pending_since is None:
            self._pending_since = now
        return max(0.0, now - max(self.last_step_end, self._pending_since))


def engine_limits(vllm_config) -> dict:
    """`set_engine_limits`' arguments, from a started engine's `vllm_config`."""
    scheduler, cache = vllm_config.scheduler_config, vllm_config.cache_config
    return {"token_budget": scheduler.max_num_batched_tokens,
            "chunk_cap": int(scheduler.long_prefill_token_threshold or 0),
            "cap_adaptive": bool(scheduler.long_prefill_token_threshold_adaptive),
            "kv_capacity_tokens": (cache.num_gpu_blocks or 0) * cache.block_size}


def _with_limits(model: EngineModel, token_budget: int | None, chunk_cap: int = 0,
                 kv_capacity_tokens: int = 0, cap_adaptive: bool = False) -> EngineModel:
    limits = {"token_budget": int(token_budget or model.token_budget),
              "prefill_chunk_cap": int(chunk_cap),
              "prefill_cap_adaptive": bool(cap_adaptive),
              "kv_capacity_tokens": int(kv_capacity_tokens or model.kv_capacity_tokens)}
    if all(getattr(model, name) == value for name, value in limits.items()):
        return model
    return EngineModel(**{**model.describe(), **limits})
