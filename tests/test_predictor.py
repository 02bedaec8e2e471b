"""The latency predictor: compiled trees, the seed formula, training on known relations,
model files, and training data read from a real trace-log file."""

from __future__ import annotations

import dataclasses
import pickle

import duckdb
import numpy as np
import pytest

from slo import model_files
from slo.predict.accuracy import (MIN_HOLDOUT, Accuracy, accuracy, improvement, judge, scores,
                                  within_goals)
from slo.predict.features import FEATURES, TrainingSet, training_sql
from slo.predict.forest import compile_forest
from slo.predict.model import (
    FORMAT,
    KIND,
    MIN_ROWS,
    SeedModel,
    e2e_s,
    load_model,
    seed_ttft_s,
    train,
)

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
COL = {name: j for j, name in enumerate(FEATURES)}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One OpenMP thread per fit: on a busy 2-core box, scikit-learn's default thread
    count made `train` ~12x slower (20 s instead of 1.6 s) through contention."""
    import sklearn.ensemble  # noqa: F401  (loads the OpenMP runtime the limit applies to)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


# --- compiled forests ----------------------------------------------------------------

def _regression_data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, 5))
    X[:, 3] = rng.integers(0, 6, rows)  # few distinct values: exact-threshold ties
    X[rng.random(rows) < 0.1, 2] = np.nan  # missing values learn a direction
    y = (np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2 + np.where(np.isnan(X[:, 2]), 2.0, X[:, 2])
         + 0.3 * X[:, 3] + rng.normal(0, 0.1, rows))
    return X, y


SETTINGS = [
    {"loss": "quantile", "quantile": 0.5, "max_iter": 20, "max_depth": 3},
    {"loss": "quantile", "quantile": 0.9, "max_iter": 60, "max_depth": None,
     "max_leaf_nodes": 15},
    {"loss": "quantile", "quantile": 0.1, "max_iter": 40, "max_depth": 8, "min_samples_leaf": 5},
    {"loss": "squared_error", "max_iter": 30, "max_depth": 5},
]


@pytest.fixture(scope="module")
def fitted():
    from sklearn.ensemble import HistGradientBoostingRegressor

    X, y = _regression_data(1500, seed=1)
    return [HistGradientBoostingRegressor(early_stopping=False, random_state=0, **kw).fit(X, y)
            for kw in SETTINGS]


@pytest.mark.parametrize("which", [[0], [1], [2], [3], [0, 1, 2, 3]])
def test_compiled_forest_matches_sklearn_on_a_matrix(fitted, which):
    estimators = [fitted[i] for i in which]
    forest = compile_forest(estimators)
    X, _ = _regression_data(400, seed=2)  # unseen rows, NaNs included
    out = forest.predict(X)
    assert out.shape == (400, len(which))
    for column, est in enumerate(estimators):
        np.testing.assert_allclose(out[:, column], est.predict(X), rtol=0, atol=1e-12)


def test_compiled_forest_matches_sklearn_row_by_row(fitted):
    forest = compile_forest(fitted)
    X, _ = _regression_data(25, seed=3)
    for row in X:
        out = forest.predict(row)
        assert out.shape == (len(fitted),)
        expected = [est.predict(row[None, :])[0] for est in fitted]
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


def test_trees_of_a_single_leaf_predict_the_baseline():
    from sklearn.ensemble import HistGradientBoostingRegressor

    X = np.arange(300, dtype=float).reshape(100, 3)
    y = np.linspace(0, 5, 100)  # 60 rows a leaf out of 100: no split is allowed
    est = HistGradientBoostingRegressor(loss="quantile", quantile=0.5, max_iter=5,
                                        min_samples_leaf=60, early_stopping=False).fit(X, y)
    forest = compile_forest([est])
    assert forest.depth == 0
    np.testing.assert_allclose(forest.predict(X)[:, 0], est.predict(X), rtol=0, atol=1e-12)
    assert forest.predict(X[0]) == pytest.approx([np.median(y)], abs=1e-12)


def test_categorical_splits_are_refused():
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(0)
    X = rng.integers(0, 8, size=(400, 2)).astype(float)
    y = np.array([5.0, -3.0, 7.0, 0.0, 9.0, -6.0, 2.0, 4.0])[X[:, 0].astype(int)]
    est = HistGradientBoostingRegressor(categorical_features=[0], max_iter=5,
                                        early_stopping=False).fit(X, y)
    with pytest.raises(ValueError, match="categorical"):
        compile_forest([est])


# --- the seed model ------------------------------------------------------------------

@pytest.mark.parametrize("prompt_tokens,ttft_s", [
    (0, 0.05),
    (1000, (50 + 50 + 2) / 1000),
    (4096, (50 + 204.8 + 33.554432) / 1000),
    (32768, (50 + 1638.4 + 2147.483648) / 1000),
])
def test_seed_ttft(prompt_tokens, ttft_s):
    assert seed_ttft_s(prompt_tokens) == pytest.approx(ttft_s, rel=1e-12)


@pytest.mark.parametrize("prompt_tokens,tpot_s", [
    (0, 0.002), (1024, 0.002), (1025, 0.003), (4096, 0.003), (4097, 0.005),
    (32768, 0.005), (32769, 0.005), (200_000, 0.005)])
def test_seed_predicts_tpot_by_context_bucket_and_one_value_per_quantile(prompt_tokens, tpot_s):
    row = np.zeros(len(FEATURES))
    row[COL["prompt_tokens"]] = prompt_tokens
    row[COL["pending_requests"]] = 30  # the seed knows nothing of load
    ttft = seed_ttft_s(prompt_tokens)
    assert SeedModel().predict(row).tolist() == [ttft, ttft, tpot_s, tpot_s]
    assert SeedModel().predict_many(np.stack([row, row])).tolist() == [
        [ttft, ttft, tpot_s, tpot_s]] * 2


def test_seed_predict_many_of_nothing_is_an_empty_table():
    assert SeedModel().predict_many(np.zeros((0, len(FEATURES)))).shape == (0, 4)


@pytest.mark.parametrize("ttft,tpot,max_tokens,expected", [
    (0.5, 0.01, 101, 1.5), (0.5, 0.01, 1, 0.5), (0.5, 0.01, 0, 0.5), (0.25, 0.02, 11, 0.45)])
def test_e2e(ttft, tpot, max_tokens, expected):
    assert e2e_s(ttft, tpot, max_tokens) == pytest.approx(expected, rel=1e-12)


# --- training on a known relation ----------------------------------------------------

def synthetic(rows: int, seed: int = 0) -> TrainingSet:
    """TTFT grows with the prompt and the requests queued ahead, TPOT with the batch;
    both times lognormal noise (sigma 0.05: a perfect median has a MAPE near 4%)."""
    rng = np.random.default_rng(seed)
    X = np.zeros((rows, len(FEATURES)))
    X[:, COL["prompt_tokens"]] = rng.integers(16, 4000, rows)
    X[:, COL["max_tokens"]] = rng.choice([64, 256, 1024], rows)
    X[:, COL["pending_requests"]] = rng.integers(0, 20, rows)
    X[:, COL["queue_depth"]] = X[:, COL["pending_requests"]]
    X[:, COL["pending_prefill_tokens"]] = (X[:, COL["pending_requests"]]
                                           * rng.integers(10, 500, rows))
    X[:, COL["running_requests"]] = rng.integers(1, 32, rows)
    X[:, COL["kv_cache_usage"]] = rng.random(rows)
    X[:, COL["recent_step_s"]] = rng.uniform(0.005, 0.03, rows)
    X[:, COL["batch_priority"]] = rng.random(rows) < 0.2
    X[:, COL["tokenize_s"]] = rng.uniform(0, 0.003, rows)
    ttft = ((0.02 + 1e-4 * X[:, COL["prompt_tokens"]] + 0.01 * X[:, COL["pending_requests"]])
            * np.exp(rng.normal(0, 0.05, rows)))
    tpot = (0.004 + 0.0005 * X[:, COL["running_requests"]]) * np.exp(rng.normal(0, 0.05, rows))
    tpot[rng.random(rows) < 0.05] = np.nan  # one-token answers have no TPOT
    return TrainingSet(X, ttft, tpot, T0 + np.arange(rows, dtype=float))


@pytest.fixture(scope="module")
def trained():
    train_part, test_part = synthetic(3000).split(0.3)
    return train(train_part, max_iter=100), train_part, test_part


def test_training_learns_the_relation_and_beats_the_seed(trained):
    model, _, test_part = trained
    assert (model.rows, model.window) == (2100, (T0, T0 + 2099))
    assert model.features == FEATURES and model.version.startswith("hgb-")
    seed, learned = accuracy(SeedModel(), test_part), accuracy(model, test_part)
    assert [(r.target, r.requests) for r in learned] == [
        ("ttft_s", 900), ("tpot_s", int(np.isfinite(test_part.tpot_s).sum()))]
    for row in learned:
        assert row.mape_p50 < 0.08, row
        assert 0.8 <= row.coverage_p90 <= 0.97, row
    for target, ratio in improvement(seed, learned).items():
        assert ratio >= 2, (target, ratio)
    assert set(improvement(seed, learned)) == {"ttft_s", "tpot_s"}


def test_p90_is_never_below_p50(trained):
    model, _, test_part = trained
    out = model.predict_many(test_part.X)
    assert out.shape == (900, 4) and np.all(out > 0)
    assert np.all(out[:, 1] >= out[:, 0]) and np.all(out[:, 3] >= out[:, 2])
    np.testing.assert_allclose(model.predict(test_part.X[7]), out[7], rtol=1e-12)


@pytest.mark.parametrize("rows", [0, 1, MIN_ROWS - 1])
def test_training_needs_min_rows(rows):
    with pytest.raises(ValueError, match=f"need at least {MIN_ROWS}"):
        train(synthetic(MIN_ROWS + 10).slice(0, rows), max_iter=5)


def test_exactly_min_rows_trains():
    assert train(synthetic(MIN_ROWS).slice(0, MIN_ROWS), max_iter=5).rows == MIN_ROWS


# --- model files ---------------------------------------------------------------------

def test_a_saved_model_loads_and_predicts_identically(trained, tmp_path):
    model, _, test_part = trained
    path = model.save(tmp_path / "models" / "latency.pkl")
    assert path == tmp_path / "models" / "latency.pkl"
    assert not list(path.parent.glob("*.tmp"))
    loaded = load_model(path)
    assert loaded.describe() == model.describe()
    np.testing.assert_array_equal(loaded.predict_many(test_part.X), model.predict_many(test_part.X))


@pytest.mark.parametrize("kind,fmt", [(KIND, FORMAT + 1), ("memory forecaster", FORMAT),
                                      ("latency", FORMAT)])
def test_a_file_of_another_kind_or_format_is_refused(trained, tmp_path, kind, fmt):
    path = model_files.save(trained[0], tmp_path / "m.pkl", kind, fmt)
    with pytest.raises(ValueError, match="not a tailguard latency model"):
        load_model(path)


def test_a_model_trained_on_other_features_is_refused(trained, tmp_path):
    other = dataclasses.replace(trained[0], features=FEATURES[:-1])
    path = other.save(tmp_path / "m.pkl")
    with pytest.raises(ValueError, match="trained on features"):
        load_model(path)


@pytest.mark.parametrize("content", [
    b"", b"not a pickle", b'{"kind": "latency model"}', pickle.dumps([1, 2])[:-3],
    pickle.dumps({"kind": KIND}), pickle.dumps("model")])
def test_a_file_that_is_not_a_model_is_a_value_error(tmp_path, content):
    path = tmp_path / "m.pkl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="m.pkl"):
        load_model(path)


# --- the retrain gate ----------------------------------------------------------------

def _scored(model: str, ttft: tuple, tpot: tuple | None, requests: int = 100) -> list[Accuracy]:
    """Per target (p50 median APE, p90 coverage[, p50 mean APE]); the mean defaults to
    the median plus 0.3. A TPOT of None: no held-out request made two tokens."""
    def row(target, n, median, cover, mean=None):
        return Accuracy(model, target, n, median + 0.3 if mean is None else mean, median, cover)
    tpot_row = row("tpot_s", 0, nan, nan) if tpot is None else row("tpot_s", requests, *tpot)
    return [row("ttft_s", requests, *ttft), tpot_row]


nan = float("nan")
LIVE = _scored("live", (0.20, 0.88), (0.10, 0.90))
GATE_CASES = [
    # id, candidate (TTFT, TPOT), accepted, reason
    ("lower on both", ((0.10, 0.88), (0.05, 0.90)), True,
     "accepted: TTFT p50 median APE 10.0% < 20.0%, TPOT p50 median APE 5.0% < 10.0%"),
    ("a tie keeps the live model", ((0.20, 0.88), (0.05, 0.90)), False,
     "refused: TTFT p50 median APE 20.0% is not below the live model's 20.0%"),
    ("worse on one target", ((0.10, 0.88), (0.11, 0.90)), False,
     "refused: TPOT p50 median APE 11.0% is not below the live model's 10.0%"),
    ("a lower mean APE alone does not beat", ((0.21, 0.88, 0.01), (0.05, 0.90)), False,
     "refused: TTFT p50 median APE 21.0% is not below the live model's 20.0%"),
    ("a higher mean APE does not refuse", ((0.10, 0.88, 5.0), (0.05, 0.90)), True,
     "accepted: TTFT p50 median APE 10.0% < 20.0%, TPOT p50 median APE 5.0% < 10.0%"),
    ("coverage 5 points further from 90% is allowed", ((0.10, 0.83), (0.05, 0.95)), True,
     "accepted: TTFT p50 median APE 10.0% < 20.0%, TPOT p50 median APE 5.0% < 10.0%"),
    ("coverage more than 5 points further is not", ((0.10, 0.80), (0.05, 0.90)), False,
     "refused: TTFT p90 coverage 80.0% is more than 5 points further from 90% than the "
     "live model's 88.0%"),
    ("a NaN never beats", ((nan, 0.88), (0.05, 0.90)), False,
     "refused: TTFT p50 median APE nan% is not below the live model's 20.0%"),
    ("no TPOT to judge: TTFT alone", ((0.10, 0.90), None), True,
     "accepted: TTFT p50 median APE 10.0% < 20.0%"),
]


@pytest.mark.parametrize("case, candidate, accepted, reason", GATE_CASES,
                         ids=[c[0] for c in GATE_CASES])
def test_the_retrain_gate(case, candidate, accepted, reason):
    live = LIVE if candidate[1] is not None else _scored("live", (0.20, 0.88), None)
    verdict = judge(_scored("cand", *candidate), live)
    assert (verdict.accepted, verdict.reason) == (accepted, reason)
    assert verdict.live["version"] == "live" and verdict.candidate["version"] == "cand"


def test_the_gate_needs_enough_held_out_requests():
    verdict = judge(_scored("cand", (0.1, 0.9), (0.05, 0.9), requests=MIN_HOLDOUT - 1),
                    _scored("live", (0.2, 0.9), (0.1, 0.9), requests=MIN_HOLDOUT - 1))
    assert not verdict.accepted
    assert verdict.reason == (f"refused: {MIN_HOLDOUT - 1} held-out requests, "
                              f"{MIN_HOLDOUT} needed to judge")


WITHIN_GOALS_CASES = [
    # id, live (TTFT, TPOT), requests, kept?
    ("both within", ((0.10, 0.85), (0.05, 0.95)), 100, True),
    ("TTFT p50 off by more than 10%", ((0.101, 0.90), (0.05, 0.90)), 100, False),
    ("TPOT coverage under 85%", ((0.05, 0.90), (0.05, 0.849)), 100, False),
    ("coverage over 95% is off too", ((0.05, 0.951), (0.05, 0.90)), 100, False),
    ("a NaN is never within", ((nan, 0.90), (0.05, 0.90)), 100, False),
    ("no TPOT to judge: TTFT alone", ((0.05, 0.90), None), 100, True),
    ("too few held out to say", ((0.05, 0.90), (0.05, 0.90)), MIN_HOLDOUT - 1, False),
]


@pytest.mark.parametrize("case, live, requests, kept", WITHIN_GOALS_CASES,
                         ids=[c[0] for c in WITHIN_GOALS_CASES])
def test_a_live_model_within_the_goals_needs_no_scheduled_fit(case, live, requests, kept):
    reason = within_goals(_scored("live", *live, requests=requests))
    assert (reason is not None) == kept
    if case == "both within":
        assert reason == ("kept, not trained: TTFT p50 median APE 10.0%, p90 coverage "
                          "85.0%, TPOT p50 median APE 5.0%, p90 coverage 95.0% on the "
                          "newest 100 requests, within the goals")


def test_scores_are_json_ready():
    assert scores(_scored("m", (0.1234567, 0.9), None)) == {
        "version": "m", "requests": 100, "ttft_p50_mape": 0.423457,
        "ttft_p50_median_ape": 0.123457, "ttft_p90_coverage": 0.9,
        "tpot_p50_mape": None, "tpot_p50_median_ape": None, "tpot_p90_coverage": None}


# --- training sets -------------------------------------------------------------------

def test_split_holds_out_the_newest_rows():
    data = synthetic(1000)
    older, newer = data.split(0.25)
    assert (len(older), len(newer)) == (750, 250)
    assert older.arrival.max() < newer.arrival.min()
    np.testing.assert_array_equal(np.concatenate([older.X, newer.X]), data.X)
    assert older.window == (T0, T0 + 749) and newer.window == (T0 + 750, T0 + 999)
    assert data.slice(0, 0).window == (0.0, 0.0)


@pytest.mark.parametrize("holdout", [0, 1, -0.1, 1.5])
def test_split_refuses_a_holdout_outside_zero_one(holdout):
    with pytest.raises(ValueError, match="holdout"):
        synthetic(10).split(holdout)


def test_from_rows_reads_training_sql_column_order():
    features = [float(j + 1) for j in range(len(FEATURES))]
    rows = [(*features, 0.25, None, T0), (*[2 * f for f in features], 0.5, 0.01, T0 + 1)]
    data = TrainingSet.from_rows(rows)
    assert len(data) == 2
    np.testing.assert_array_equal(data.X, [features, [2 * f for f in features]])
    np.testing.assert_array_equal(data.ttft_s, [0.25, 0.5])
    np.testing.assert_array_equal(data.tpot_s, [np.nan, 0.01])
    np.testing.assert_array_equal(data.arrival, [T0, T0 + 1])
    assert len(TrainingSet.from_rows([])) == 0


def _request(i: int, **fields) -> dict:
    row = {"request_id": f"r{i}", "status": "ok", "priority": "realtime",
           "arrival_ts": T0 + i, "prompt_tokens": 100 + i, "max_tokens": 64,
           "queue_depth": i, "running_requests": 2 * i, "kv_cache_usage": 0.5,
           "recent_step_s": 0.02, "pending_requests": i + 1, "pending_prefill_tokens": 1000 * i,
           "tokenize_s": 0.001, "ttft_s": 0.1 * (i + 1), "tpot_s": 0.01 * (i + 1)}
    return {**row, **fields}


@pytest.fixture
def trace_db(tmp_path):
    from observe.tracelog import TraceLog

    path = tmp_path / "trace.duckdb"
    with TraceLog(str(path)) as log:
        # Added out of arrival order: the query sorts.
        log.add("requests", _request(3, priority="batch", kv_cache_usage=None, tokenize_s=None,
                                     pending_prefill_tokens=None))
        log.add("requests", _request(1, tpot_s=None))  # one token: kept, TPOT NaN
        log.add("requests", _request(2, status="rejected"))
        log.add("requests", _request(4, queue_depth=None))  # from before load was logged
        log.add("requests", _request(5, ttft_s=None))
        log.add("requests", _request(6, status="error"))
        log.add("requests", _request(0))
    return path


def _expected_row(i: int, batch: float = 0.0, kv: float = 0.5, tokenize: float = 0.001,
                  prefill: float | None = None) -> list[float]:
    values = {"prompt_tokens": 100 + i, "max_tokens": 64, "queue_depth": i,
              "running_requests": 2 * i, "kv_cache_usage": kv, "recent_step_s": 0.02,
              "pending_requests": i + 1,
              "pending_prefill_tokens": 1000 * i if prefill is None else prefill,
              "batch_priority": batch, "tokenize_s": tokenize}
    assert set(values) == set(FEATURES)
    return [float(values[name]) for name in FEATURES]


def test_training_sql_on_a_real_trace_log(trace_db):
    with duckdb.connect(str(trace_db), read_only=True) as conn:
        rows = conn.execute(training_sql()).fetchall()
    data = TrainingSet.from_rows(rows)
    np.testing.assert_array_equal(data.arrival, [T0, T0 + 1, T0 + 3])
    np.testing.assert_array_equal(data.X, [
        _expected_row(0), _expected_row(1), _expected_row(3, batch=1.0, kv=0.0, tokenize=0.0,
                                                          prefill=0.0)])
    np.testing.assert_allclose(data.ttft_s, [0.1, 0.2, 0.4], rtol=1e-15)
    np.testing.assert_allclose(data.tpot_s, [0.01, np.nan, 0.04], rtol=1e-15)


def test_training_sql_since_bounds_the_window(trace_db):
    since = "2026-01-01 00:00:01+00"  # T0 + 1
    with duckdb.connect(str(trace_db), read_only=True) as conn:
        rows = conn.execute(training_sql(since)).fetchall()
    np.testing.assert_array_equal(TrainingSet.from_rows(rows).arrival, [T0 + 1, T0 + 3])


def test_a_model_saved_before_the_package_split_still_loads(tmp_path, monkeypatch):
    """Models pickled when the forecaster lived in `slo.backtest` name that module; the
    loader finds their classes where they live now."""
    import sys

    from slo.forecast import forecaster as moved
    from slo.forecast.baselines import baselines

    monkeypatch.setitem(sys.modules, "slo.backtest", moved)  # pickle as the old code did
    monkeypatch.setattr(moved.MemoryForecaster, "__module__", "slo.backtest")
    old = moved.MemoryForecaster(baselines()[0], "kv_cache_usage", 60.0, 5.0, backtest=None)
    path = old.save(tmp_path / "old.pkl")
    assert b"slo.backtest" in path.read_bytes()
    monkeypatch.delitem(sys.modules, "slo.backtest")
    monkeypatch.undo()

    loaded = moved.load_forecaster(path)
    assert type(loaded) is moved.MemoryForecaster
    assert loaded.horizon_s == 60.0
