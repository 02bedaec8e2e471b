"""How good a latency model is on requests it never saw: the numbers behind
`tailguard predict eval` and the benchmark.

- p50 MAPE: mean of |predicted median - actual| / actual (and the median of that
  ratio, which one slow outlier cannot move);
- p90 coverage: the share of requests at or under their predicted p90, which should
  be near 90% (85-95% is the goal);
- the same for the seed formula, so "better than the seed" is a ratio, not a claim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slo.features import TrainingSet

# (target, column of the p50 prediction, column of the p90 prediction)
COLUMNS = (("ttft_s", 0, 1), ("tpot_s", 2, 3))


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
