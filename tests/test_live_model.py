"""The live engine model (serving/engine/live_model.py): the prior until enough steps,
then the same least-squares fit as the simulator's on the newest steps; the stall
clock; what /admin/policies shows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from observe.stats import StepRecord
from serving.engine.live_model import (
    MIN_STEPS,
    OVERHEAD_MIN,
    PRIOR,
    REFIT_S,
    LiveEngineModel,
    engine_limits,
)
from slo.sim.engine_model import fit_steps

# a made-up engine: 5 ms a step, 1 ms a sequence, 0.2 ms a token, 10 ns an attention pair
BASE, PER_SEQ, PER_TOKEN, PER_PAIR = 0.005, 0.001, 0.0002, 1e-8


def step(i: int, seqs: int, tokens: int, start: float = 100.0, pairs: int = 0) -> StepRecord:
    duration = BASE + PER_SEQ * seqs + PER_TOKEN * tokens + PER_PAIR * pairs
    return StepRecord(i, start + i, duration, 0.0, tokens, tuple(f"r{k}" for k in range(seqs)),
                      pairs)


def test_the_prior_holds_until_enough_steps_then_the_fit_is_the_simulators():
    live = LiveEngineModel(token_budget=1024)
    assert live.model == PRIOR.__class__(**{**PRIOR.describe(), "token_budget": 1024})
    steps = [step(i, 1 + i % 7, 10 + 37 * i % 900, pairs=(i % 5) * 100_000 + 41 * i * i)
             for i in range(MIN_STEPS - 1)]
    for s in steps:
        live.on_step(s)
    assert live.refit(now=0.0) is live.model and live.model.steps_fitted == 0  # too few
    steps.append(step(MIN_STEPS, 3, 500))
    live.on_step(steps[-1])
    model = live.refit(now=1.0)
    coef, r2 = fit_steps(np.array([s.duration_s for s in steps]),
                         np.array([len(s.request_ids) for s in steps], dtype=float),
                         np.array([s.scheduled_tokens for s in steps], dtype=float),
                         np.array([s.attention_pairs for s in steps], dtype=float),
                         relative=True)
    assert (model.step_base_s, model.step_per_seq_s, model.step_per_token_s,
            model.step_per_pair_s) == pytest.approx((BASE, PER_SEQ, PER_TOKEN, PER_PAIR),
                                                    rel=1e-6)
    assert [model.step_base_s, model.step_per_seq_s, model.step_per_token_s,
            model.step_per_pair_s] == pytest.approx(list(coef))
    assert model.token_budget == 1024 and model.steps_fitted == MIN_STEPS
    # refits at most every REFIT_S, and only with new steps
    live.on_step(step(99, 2, 100))
    assert live.refit(now=1.0 + REFIT_S / 2) is model
    assert live.refit(now=1.0 + REFIT_S).steps_fitted == MIN_STEPS + 1
    assert live.refit(now=1.0 + 3 * REFIT_S).steps_fitted == MIN_STEPS + 1


def test_the_stall_clock_starts_when_work_waits_not_at_the_last_step():
    live = LiveEngineModel()
    live.on_step(step(0, 1, 10, start=0.0))  # the engine's last step ended at ~0
    assert live.stalled_s(60.0, pending=False) == 0.0  # idle a minute: not stalled
    assert live.stalled_s(61.0, pending=True) == 0.0  # work arrives: the clock starts
    assert live.stalled_s(64.0, pending=True) == 3.0  # no step since: 3 s stalled
    live.on_step(step(0, 1, 10, start=64.5))  # a step: the clock restarts from it
    assert live.stalled_s(66.0, pending=True) == pytest.approx(66.0 - 64.5 - 0.008)
    assert live.stalled_s(67.0, pending=False) == 0.0


def test_describe_is_json_safe_and_says_where_the_model_comes_from():
    live = LiveEngineModel()
    shown = live.describe()
    json.dumps(shown, allow_nan=False)
    assert shown["source"] == "prior" and shown["fit_r2"] is None and shown["steps_seen"] == 0


def test_the_engines_limits_and_its_adaptive_chunk_cap_survive_every_refit():
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_batched_tokens=1024,
                                         long_prefill_token_threshold=256,
                                         long_prefill_token_threshold_adaptive=True),
        cache_config=SimpleNamespace(num_gpu_blocks=100, block_size=16))
    limits = engine_limits(config)
    assert limits == {"token_budget": 1024, "chunk_cap": 256, "cap_adaptive": True,
                      "kv_capacity_tokens": 1600}
    live = LiveEngineModel()
    live.set_engine_limits(**limits)
    for i in range(MIN_STEPS):
        live.on_step(step(i, 1 + i % 5, 10 + 53 * i % 700))
    model = live.refit(now=0.0)
    assert model.steps_fitted == MIN_STEPS
    assert (model.token_budget, model.prefill_chunk_cap, model.prefill_cap_adaptive,
            model.kv_capacity_tokens) == (1024, 256, True, 1600)
    assert model.chunk_cap(2) == 512 and model.chunk_cap(8) == 256 and model.chunk_cap(1) == 0


def _served(ttft_s: float | None, engine_ttft_s: float | None, status: str = "ok"):
    return SimpleNamespace(ttft_s=ttft_s, engine_ttft_s=engine_ttft_s, status=status)


def test_the_overhead_after_the_check_is_learned_from_requests_that_found_nothing_ahead():
    live = LiveEngineModel()
    assert live.model.overhead_s == PRIOR.overhead_s  # the prior until enough samples
    for i in range(OVERHEAD_MIN - 1):
        live.on_request(_served(0.050 + 0.001 * i, 0.046))
    live.on_request(_served(0.9, None))  # judged with work ahead: not a sample
    live.on_request(_served(None, 0.046, "error"))  # failed: not a sample
    assert live.model.overhead_s == PRIOR.overhead_s
    live.on_request(_served(0.050 + 0.001 * (OVERHEAD_MIN - 1), 0.046))
    # the 20 samples 4 ms .. 23 ms: their median, 13.5 ms
    assert live.model.overhead_s == pytest.approx(0.0135)
    for s in steps_for_a_fit():
        live.on_step(s)
    assert live.refit(now=0.0).overhead_s == pytest.approx(0.0135)  # a refit keeps it


def test_an_estimate_too_high_for_an_idle_engine_learns_no_negative_overhead():
    live = LiveEngineModel()
    for _ in range(OVERHEAD_MIN):
        live.on_request(_served(0.040, 0.046))
    assert live.model.overhead_s == 0.0


def steps_for_a_fit() -> list[StepRecord]:
    return [step(i, 1 + i % 7, 10 + 37 * i % 900, pairs=(i % 5) * 100_000 + 41 * i * i)
            for i in range(MIN_STEPS + 5)]
