"""A model of one engine replica, calibrated from its own trace log: what an engine
step costs and how much fits in one.

- Step time: least squares of each `llm.step` span's duration on its batch size, its
  scheduled tokens and its attention pairs (each scheduled token times the tokens it
  attends to: the prompt computed before it and itself), since attention is what makes
  a long prompt's later chunks dearer than its first and a decode over a long context
  dearer than one over a short:
  `step_s = base + per_seq * seqs + per_token * tokens + per_pair * pairs`.
  A trace log written before the probe counted pairs (no attribute) is read as if each
  step prefilled fresh prompts (`attention_pairs(0, tokens)`).
- Token budget: the most tokens any step scheduled (vLLM's max_num_batched_tokens,
  which chunked prefill fills).
- Overhead: what a request spends outside engine steps even on an idle engine (HTTP,
  tokenizing, the engine loop picking it up, returning the token): the median of
  TTFT minus prefill over requests that arrived to an idle engine.
- KV capacity in tokens: in-flight tokens (prompts plus tokens generated so far of the
  requests running in each second) divided by the KV usage the engine reported then,
  the median over seconds with real usage. vLLM allocates in blocks, so this is the
  usable capacity as the engine saw it, not the raw cache size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

Query = Callable[[str], tuple[list[str], list[tuple]]]
MIN_STEPS = 200

STEPS_SQL = """SELECT duration_s,
  CAST(attributes->>'$."tailguard.step.batch_size"' AS INTEGER) AS seqs,
  CAST(attributes->>'$."tailguard.step.scheduled_tokens"' AS INTEGER) AS tokens,
  CAST(attributes->>'$."tailguard.step.attention_pairs"' AS BIGINT) AS pairs
FROM spans WHERE name = 'llm.step' AND duration_s IS NOT NULL
  AND attributes->>'$."tailguard.step.batch_size"' IS NOT NULL
  AND attributes->>'$."tailguard.step.scheduled_tokens"' IS NOT NULL"""

OVERHEAD_SQL = """SELECT median(ttft_s - prefill_s), count(*) FROM requests
WHERE status = 'ok' AND ttft_s IS NOT NULL AND prefill_s IS NOT NULL
  AND coalesce(running_requests, 0) = 0 AND coalesce(pending_requests, 0) = 0"""
KV_SQL = """WITH r AS (
  SELECT epoch(arrival_ts) + coalesce(tokenize_s, 0) + coalesce(queue_s, 0) AS s,
         epoch(arrival_ts) + e2e_s AS e, prompt_tokens AS p, output_tokens AS o
  FROM requests WHERE status = 'ok' AND e2e_s IS NOT NULL)
SELECT k.kv_cache_usage AS usage,
       sum(r.p + r.o * least(1.0, (epoch(k.ts) - r.s) / greatest(r.e - r.s, 1e-3))) AS tokens
FROM engine_stats k JOIN r ON epoch(k.ts) BETWEEN r.s AND r.e
WHERE k.kv_cache_usage > 0.05 GROUP BY k.ts, k.kv_cache_usage"""


@dataclass(frozen=True, slots=True)
class EngineModel:
    step_base_s: float
    step_per_seq_s: float
    step_per_token_s: float
    step_per_pair_s: float  # per attention pair (`attention_pairs`)
    token_budget: int  # tokens one step can schedule (prefill chunks + decodes)
    kv_capacity_tokens: int
    overhead_s: float = 0.0  # per request, outside engine steps
    # the most prompt tokens one request gets a step while another is in the engine
    # (vLLM's long_prefill_token_threshold; 0: none, a prompt takes the whole budget)
    prefill_chunk_cap: int = 0
    # vLLM's long_prefill_token_threshold_adaptive: the cap never below a fair share
    prefill_cap_adaptive: bool = False
    steps_fitted: int = 0
    fit_r2: float = float("nan")

    def __post_init__(self) -> None:
        if self.step_base_s <= 0 or self.token_budget < 1 or self.kv_capacity_tokens < 1:
            raise ValueError(f"not a usable engine model: {self}")

    def step_s(self, seqs: int, tokens: int, pairs: int) -> float:
        return (self.step_base_s + self.step_per_seq_s * seqs + self.step_per_token_s * tokens
                + self.step_per_pair_s * pairs)

    def steps_s(self, steps: int, seqs: int, tokens: int, pairs: int) -> float:
        """`steps` steps of `seqs` sequences each that schedule `tokens` tokens and
        `pairs` attention pairs among them: the model is linear, so their sum is this."""
        return (steps * (self.step_base_s + self.step_per_seq_s * seqs)
                + self.step_per_token_s * tokens + self.step_per_pair_s * pairs)

    def chunk_cap(self, in_engine: int) -> int:
        """The most prompt tokens one request gets a step while `in_engine` requests
        (running and waiting) are in the engine, as vLLM's scheduler sets it: none for a
        request alone (there is nobody to starve); adaptive, never below the budget's
        fair share. 0: no cap."""
        cap = self.prefill_chunk_cap
        if not cap or in_engine <= 1:
            return 0
        return max(cap, self.token_budget // in_engine) if self.prefill_cap_adaptive else cap

    def with_chunk_cap(self, cap: int, fixed: bool = False) -> EngineModel:
        """This engine under a prefill chunk cap of `cap` tokens (0: none), adaptive
        unless `fixed` (a log does not say how its engine capped chunks: as told)."""
        return replace(self, prefill_chunk_cap=cap, prefill_cap_adaptive=bool(cap) and not fixed)

    def describe(self) -> dict:
        return asdict(self)


def attention_pairs(computed: int, scheduled: int) -> int:
    """Query-key pairs of `scheduled` tokens of one sequence after `computed` of it: token
    j of the chunk attends to the `computed` before the chunk and the j up to itself.
    A fresh prompt of P tokens costs `attention_pairs(0, P)` whichever chunks it is
    prefilled in; a decode step over a context of C tokens `attention_pairs(C, 1)`."""
    return scheduled * computed + scheduled * (scheduled + 1) // 2


def fit_steps(duration: np.ndarray, seqs: np.ndarray, tokens: np.ndarray,
              pairs: np.ndarray, relative: bool = False) -> tuple[np.ndarray, float]:
    """Non-negative coefficients (a negative cost would let a bigger step be cheaper)
    and R^2 of the fit. `relative`: minimise relative rather than absolute error, so a
    few long prefill steps do not set the cost of the many short ones (what a deadline
    of 200 ms for a short prompt needs)."""
    X = np.column_stack([np.ones_like(duration), seqs, tokens, pairs])
    scale = 1.0 / np.maximum(duration, 1e-6) if relative else np.ones_like(duration)
    Xw, yw = X * scale[:, None], duration * scale
    coef, *_ = np.linalg.lstsq(Xw, yw, rcond=None)
    for _ in range(X.shape[1]):  # drop negative terms and refit (a tiny active-set NNLS)
        keep = coef > 0
        keep[0] = True
        if keep.all():
            break
        sub, *_ = np.linalg.lstsq(Xw[:, keep], yw, rcond=None)
        coef = np.zeros(X.shape[1])
        coef[keep] = np.maximum(sub, 0)
    residual = duration - X @ coef
    r2 = 1 - residual.var() / duration.var() if duration.var() > 0 else float("nan")
    return coef, float(r2)


def calibrate(query: Query) -> EngineModel:
    """Fit the model on the trace log that `query` reads."""
    columns, rows = query(STEPS_SQL)
    if len(rows) < MIN_STEPS:
        raise ValueError(f"the trace log holds {len(rows)} engine steps; calibrating "
                         f"needs at least {MIN_STEPS} (record some traffic first)")
    data = np.array([r[:3] + (attention_pairs(0, r[2]) if r[3] is None else r[3],)
                     for r in rows], dtype=float)
    duration, seqs, tokens, pairs = data.T
    coef, r2 = fit_steps(duration, seqs, tokens, pairs)
    return EngineModel(*map(float, coef), token_budget=int(tokens.max()),
                       kv_capacity_tokens=_kv_capacity(query),
                       overhead_s=_overhead(query), steps_fitted=len(rows),
                       fit_r2=r2)


def _overhead(query: Query) -> float:
    _, rows = query(OVERHEAD_SQL)
    median, count = rows[0]
    return float(median) if count and median is not None and median > 0 else 0.0


def _kv_capacity(query: Query) -> int:
    _, rows = query(KV_SQL)
    ratios = [tokens / usage for usage, tokens in rows if usage and tokens]
    if len(ratios) < 10:
        # never filled enough to tell: assume it could hold its busiest second many times
        return 1_000_000
    return int(np.median(ratios))
