"""How good a latency model is: on requests it never saw (the numbers behind
`tailguard predict train/eval` and the benchmark), and as served (the rows' own
predictions, shown by `tailguard predict eval` and the console's Forecasts page).

- p50 MAPE: mean of |predicted median - actual| / actual (and the median of that
  ratio, which one slow outlier cannot move);
- p90 coverage: the share of requests at or under their predicted p90, which should
  be near 90% (85-95% is the goal);
- live, per finished request (`judge_served`), the same rule feeds the server's
  `tailguard_prediction_*` metrics;
- the same for the seed formula, so "better than the seed" is a ratio, not a claim.

Both count only requests that have the prediction being judged; a served request that
was never predicted is no miss, but is counted apart (`never_predicted_sql`). The rule
is written out in docs/prediction.md ("How accuracy is measured").

`judge` is the retrain gate: a freshly trained candidate replaces the live model only
if it beats it on the newest requests, which neither was trained on (docs/prediction.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from observe.registry import STATUS_OK
from slo.predict.features import TrainingSet
from slo.predict.model import SeedModel

if TYPE_CHECKING:
    from observe.query import QueryResult
    from observe.record import RequestRecord

# (target, column of the p50 prediction, column of the p90 prediction)
COLUMNS = (("ttft_s", 0, 1), ("tpot_s", 2, 3))
# The retrain gate (docs/prediction.md, "The retrain gate").
HOLDOUT_SHARE: Final = 0.2  # the newest share of a retrain's rows: judged on, never trained on
MIN_HOLDOUT: Final = 50  # fewer held-out requests than this judge nothing
COVERAGE_GOAL: Final = 0.9
COVERAGE_SLACK: Final = 0.05  # a candidate's p90 coverage may be this much further from 90%
GATE_EVENT: Final = "latency_model"  # its `policy_events.policy`: one row per decision
# A live model this good on the newest requests is kept without a scheduled fit: the
# predictor's goals (p50 within 10%, p90 covering 85-95%); a fit of the four quantile
# models takes about 6 s of a core on a 2-vCPU machine, beside the engine.
GOAL_MEDIAN_APE: Final = 0.10
GOAL_COVERAGE: Final = (0.85, 0.95)


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


def held_out_report(model, data: TrainingSet) -> str:
    """`model` against the seed formula on held-out requests, as `tailguard predict`
    prints it: the request count, one table row per model and target, the ratio."""
    seed, trained = accuracy(SeedModel(), data), accuracy(model, data)
    ratios = improvement(seed, trained)
    return (f"held-out requests: {len(data)}\n" + format_table(seed + trained)
            + "p50 MAPE, seed / model: " + ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()))


# --- as served: what the server predicted when it admitted each request ---------------

# A served request: answered, with a first token to judge a TTFT prediction against.
_SERVED = "status = 'ok' AND ttft_s > 0"
# What served accuracy can be grouped by: the model, or the context bucket (as the
# server's live `tailguard_prediction_*` metrics are labelled).
ACCURACY_GROUPS: Final = ("predictor_version", "context_bucket")
# `tailguard predict eval` has printed these headings since it first shipped.
CLI_HEADINGS: Final = {"predictor_version": "model", "ttft_p50_mape": "ttft_mape",
                       "tpot_p50_mape": "tpot_mape"}


def _served_where(since_minutes: int | None) -> str:
    since = "" if since_minutes is None else \
        f" AND arrival_ts > now() - INTERVAL {int(since_minutes)} MINUTE"
    return f"WHERE {_SERVED}{since}"


def served_accuracy_sql(since_minutes: int | None = None, by: str = "predictor_version") -> str:
    """Per predictor version (or `by` another of ACCURACY_GROUPS), on the served requests
    predicted (in the last `since_minutes`, or all): p50 MAPE and p90 coverage of TTFT
    and of TPOT, each over the requests with that actual above 0 and that prediction
    present."""
    if by not in ACCURACY_GROUPS:
        raise ValueError(f"by must be one of {ACCURACY_GROUPS}, not {by!r}")
    return (f"SELECT {by}, count(*) AS requests, "
            "avg(abs(predicted_ttft_s - ttft_s) / ttft_s) AS ttft_p50_mape, "
            "avg(CASE WHEN ttft_s <= predicted_ttft_p90_s THEN 1.0 ELSE 0.0 END) "
            "FILTER (predicted_ttft_p90_s IS NOT NULL) AS ttft_p90_coverage, "
            "avg(abs(predicted_tpot_s - tpot_s) / tpot_s) "
            "FILTER (tpot_s > 0 AND predicted_tpot_s IS NOT NULL) AS tpot_p50_mape, "
            "avg(CASE WHEN tpot_s <= predicted_tpot_p90_s THEN 1.0 ELSE 0.0 END) "
            "FILTER (tpot_s > 0 AND predicted_tpot_p90_s IS NOT NULL) AS tpot_p90_coverage "
            f"FROM requests {_served_where(since_minutes)} AND predicted_ttft_s IS NOT NULL "
            f"GROUP BY ALL ORDER BY requests DESC, {by}")


def never_predicted_sql(since_minutes: int | None = None) -> str:
    """How many served requests there were and how many of them carry no prediction."""
    return ("SELECT count(*) AS served, count(*) FILTER (predicted_ttft_s IS NULL) "
            f"AS never_predicted FROM requests {_served_where(since_minutes)}")


def never_predicted_line(served: int, never: int) -> str:
    share = f" ({never / served:.1%})" if served else ""
    return f"never predicted: {never} of {served} served requests{share}"


def served_report(accuracy_rows: QueryResult, never: QueryResult) -> str:
    """The two queries' answers as `tailguard predict eval` prints them."""
    from dataclasses import replace

    from observe.query import format_result

    headed = replace(accuracy_rows, columns=[CLI_HEADINGS.get(c, c)
                                             for c in accuracy_rows.columns])
    served, never_predicted = never.rows[0]
    return format_result(headed) + never_predicted_line(served, never_predicted) + "\n"


@dataclass(frozen=True, slots=True)
class Judged:
    """One finished request's prediction of one target, judged as `served_accuracy_sql`
    judges a row: what the server's live prediction metrics count."""

    target: str  # "ttft_s" or "tpot_s", as in COLUMNS
    error: float | None  # |predicted p50 - actual| / actual; None without a p50
    within_p90: bool | None  # actual <= predicted p90; None without a p90


def judge_served(rec: RequestRecord) -> list[Judged]:
    """The served-accuracy rule for one live request: a served request (status ok,
    TTFT > 0) that carries a prediction is judged on each target whose actual is above
    0 (no TPOT for a one-token answer); nothing for any other request."""
    pred = rec.prediction
    if rec.status != STATUS_OK or not (rec.ttft_s or 0) > 0 or pred is None \
            or not _given(pred.ttft_s):
        return []
    out = []
    for target, p50, p90 in (("ttft_s", pred.ttft_s, pred.ttft_p90_s),
                             ("tpot_s", pred.tpot_s, pred.tpot_p90_s)):
        actual = getattr(rec, target)
        if actual is None or not actual > 0 or not (_given(p50) or _given(p90)):
            continue
        out.append(Judged(target, abs(p50 - actual) / actual if _given(p50) else None,
                          actual <= p90 if _given(p90) else None))
    return out


def _given(value: float | None) -> bool:
    """A prediction is present: not missing (NULL in the trace log) and a number."""
    return value is not None and math.isfinite(value)


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


def within_goals(live: list[Accuracy]) -> str | None:
    """Why a scheduled retrain need not fit a candidate: on every target the held-out
    requests have (at least MIN_HOLDOUT of them), the live model's p50 median APE is
    within GOAL_MEDIAN_APE and its p90 coverage within GOAL_COVERAGE. None otherwise."""
    judged = [m for m in live if m.requests]
    if not judged or live[0].requests < MIN_HOLDOUT:
        return None
    low, high = GOAL_COVERAGE
    if not all(m.median_ape_p50 <= GOAL_MEDIAN_APE and low <= m.coverage_p90 <= high
               for m in judged):
        return None
    return "kept, not trained: " + ", ".join(
        f"{m.target.removesuffix('_s').upper()} p50 median APE {m.median_ape_p50:.1%}, "
        f"p90 coverage {m.coverage_p90:.1%}" for m in judged) + \
        f" on the newest {live[0].requests} requests, within the goals"
