"""How good a latency model is on requests it never saw: the numbers behind
`tailguard predict eval` and the benchmark.

- p50 MAPE: mean of |predicted median - actual| / actual (and the median of that
  ratio, which one slow outlier cannot move);
- p90 coverage: the share of requests at or under their predicted p90, which should
  be near 90% (85-95% is the goal);
- the same for the seed formula, so "better than the seed" is a ratio, not a claim.

`judge` is the retrain gate: a freshly trained candidate replaces the live model only
if it beats it on the newest requests, which neither was trained on (docs/prediction.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from slo.predict.features import TrainingSet

# (target, column of the p50 prediction, column of the p90 prediction)
COLUMNS = (("ttft_s", 0, 1), ("tpot_s", 2, 3))
# The retrain gate (docs/prediction.md, "The retrain gate").
HOLDOUT_SHARE: Final = 0.2  # the newest share of a retrain's rows: judged on, never trained on
MIN_HOLDOUT: Final = 50  # fewer held-out requests than this judge nothing
COVERAGE_GOAL: Final = 0.9
COVERAGE_SLACK: Final = 0.05  # a candidate's p90 coverage may be this much further from 90%
GATE_EVENT: Final = "latency_model"  # its `policy_events.policy`: one row per decision


@dataclass(frozen=True, slots=True)
class Accuracy:
    model: str
    target: str
    requests: int
    mape_p50: float
    median_ape_p50: float
    coverage_p90: float


def accuracy(model, data: TrainingSet) -> list[Accuracy]:
    """One row per target, judged on `data` (held-out requests)."""
    preds = model.predict_many(data.X)
    out = []
    for target, p50, p90 in COLUMNS:
        actual = getattr(data, target)
        keep = np.isfinite(actual) & (actual > 0)
        y, median, high = actual[keep], preds[keep, p50], preds[keep, p90]
        ape = np.abs(median - y) / y
        out.append(Accuracy(model.version, target, int(keep.sum()),
                            float(ape.mean()) if len(y) else float("nan"),
                            float(np.median(ape)) if len(y) else float("nan"),
                            float(np.mean(y <= high)) if len(y) else float("nan")))
    return out


def format_table(rows: list[Accuracy]) -> str:
    lines = [f"{'model':<14} {'target':<7} {'requests':>8} {'p50 MAPE':>9} "
             f"{'p50 median APE':>15} {'p90 coverage':>13}"]
    for r in rows:
        lines.append(f"{r.model:<14} {r.target:<7} {r.requests:>8} {r.mape_p50:>9.1%} "
                     f"{r.median_ape_p50:>15.1%} {r.coverage_p90:>13.1%}")
    return "\n".join(lines) + "\n"


def improvement(baseline: list[Accuracy], model: list[Accuracy]) -> dict[str, float]:
    """How many times lower the model's p50 MAPE is than the baseline's, per target."""
    return {b.target: b.mape_p50 / m.mape_p50 for b, m in zip(baseline, model)
            if m.mape_p50 > 0}


@dataclass(frozen=True, slots=True)
class Verdict:
    accepted: bool
    reason: str
    candidate: dict  # `scores` of each model on the same held-out requests
    live: dict


def scores(rows: list[Accuracy]) -> dict:
    """JSON-ready: version, requests, and per target the p50 prediction's mean and
    median APE and the p90 coverage (None where there was nothing to judge)."""
    out: dict = {"version": rows[0].model, "requests": rows[0].requests}
    for r in rows:
        name = r.target.removesuffix("_s")
        for key, value in ((f"{name}_p50_mape", r.mape_p50),
                           (f"{name}_p50_median_ape", r.median_ape_p50),
                           (f"{name}_p90_coverage", r.coverage_p90)):
            out[key] = None if math.isnan(value) else round(value, 6)
    return out


def _faults(c: Accuracy, live: Accuracy) -> list[str]:
    """Why `c` does not beat `live` on one target (nothing if it does)."""
    name, out = c.target.removesuffix("_s").upper(), []
    if not c.median_ape_p50 < live.median_ape_p50:  # NaN never beats
        out.append(f"{name} p50 median APE {c.median_ape_p50:.1%} is not below the live "
                   f"model's {live.median_ape_p50:.1%}")
    miss, live_miss = abs(c.coverage_p90 - COVERAGE_GOAL), abs(live.coverage_p90 - COVERAGE_GOAL)
    if not miss <= live_miss + COVERAGE_SLACK + 1e-9:  # 1e-9: exactly the slack is allowed
        out.append(f"{name} p90 coverage {c.coverage_p90:.1%} is more than "
                   f"{COVERAGE_SLACK * 100:g} points further from 90% than the live "
                   f"model's {live.coverage_p90:.1%}")
    return out


def judge(candidate: list[Accuracy], live: list[Accuracy]) -> Verdict:
    """Accept the candidate only if, on every target the held-out requests have, the
    median APE of its p50 is strictly lower than the live model's and its p90 coverage
    is no more than COVERAGE_SLACK further from 90%. A tie keeps the live model. The
    median, not the mean: with tens of held-out requests one tiny actual latency moves
    the mean APE by points, and the mean favours under-prediction (its APE is at most
    100%, an over-prediction's is unbounded)."""
    judged = [(c, m) for c, m in zip(candidate, live) if c.requests]
    faults = [f for c, m in judged for f in _faults(c, m)]
    if not judged or candidate[0].requests < MIN_HOLDOUT:
        faults.insert(0, f"{candidate[0].requests} held-out requests, "
                         f"{MIN_HOLDOUT} needed to judge")
    if faults:
        reason = "refused: " + "; ".join(faults)
    else:
        reason = "accepted: " + ", ".join(
            f"{c.target.removesuffix('_s').upper()} p50 median APE {c.median_ape_p50:.1%} < "
            f"{m.median_ape_p50:.1%}" for c, m in judged)
    return Verdict(not faults, reason, scores(candidate), scores(live))
