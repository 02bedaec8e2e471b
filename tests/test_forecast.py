"""Memory forecasting: engine_stats resampled to a regular series, the forecasters
(causal by construction), the rolling-origin backtest and the saved forecaster."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slo.forecast.backtest import BOUNDS, backtest, clip
from slo.forecast.baselines import ALPHAS, EWMA, Holt, LastValue, RidgeLags
from slo.forecast.forecaster import MemoryForecaster, load_forecaster
from slo.forecast.lstm import LSTMForecaster
from slo.forecast.series import COLUMNS, Series, horizon_steps, series_sql

KV = "kv_cache_usage"
T0 = 1_767_225_600.0


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: the LSTM fits stay fast on a busy 2-core box."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def row(ts: float, kv: float, scale: float = 1.0) -> tuple:
    """One series_sql row: epoch, then COLUMNS (all derived from kv, times `scale`)."""
    return (ts, kv, 1e9 * kv * scale, 10 * kv * scale, 2.0 * scale, 100 * kv * scale,
            50.0 * scale, 3.0 * scale, 0.0)


def make_series(y: np.ndarray, step_s: float = 5.0, seed: int = 0) -> Series:
    """`y` as kv_cache_usage, with exogenous columns that follow it loosely."""
    rng = np.random.default_rng(seed)
    values = np.zeros((len(y), len(COLUMNS)))
    values[:, COLUMNS.index(KV)] = y
    values[:, COLUMNS.index("rss_bytes")] = 1e9 + 1e8 * y
    values[:, COLUMNS.index("running")] = 20 * y + rng.normal(0, 0.5, len(y))
    values[:, COLUMNS.index("waiting")] = rng.poisson(2, len(y))
    # Prompt load leads the cache by three steps (what the LSTM's exogenous inputs are for).
    lead = np.concatenate([y[3:], np.repeat(y[-1:], min(3, len(y)))])
    values[:, COLUMNS.index("prompt_tokens")] = 500 + 300 * lead + rng.normal(0, 5, len(y))
    values[:, COLUMNS.index("generation_tokens")] = 200 + rng.normal(0, 5, len(y))
    values[:, COLUMNS.index("finished")] = rng.poisson(3, len(y))
    return Series(T0, step_s, values)


def periodic(steps: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    return 0.5 + 0.3 * np.sin(2 * math.pi * t / 60) + rng.normal(0, 0.01, steps)


# --- resampling ----------------------------------------------------------------------

def _kv_rows(times_and_values) -> list[tuple]:
    return [row(ts, kv) for ts, kv in times_and_values]


@pytest.mark.parametrize("rows,step_s,start,expected_kv", [
    # 100..109 at step 5: buckets [100, 105) and [105, 110), the mean of each.
    (_kv_rows((100 + i, i / 10) for i in range(10)), 5.0, 100.0, [0.2, 0.7]),
    # The first bucket starts on a multiple of the step, not at the first row.
    (_kv_rows((102 + i, i / 10) for i in range(10)), 5.0, 100.0, [0.1, 0.5, 0.85]),
    (_kv_rows((100 + i, i / 10) for i in range(10)), 2.0, 100.0, [0.05, 0.25, 0.45, 0.65, 0.85]),
    # One row a bucket: the series is the rows.
    (_kv_rows([(7, 0.25), (8, 0.5), (9, 0.75)]), 1.0, 7.0, [0.25, 0.5, 0.75]),
    # Unsorted input is sorted first.
    (_kv_rows([(109, 0.9), (100, 0.0), (105, 0.5), (101, 0.1), (107, 0.7)]), 5.0, 100.0,
     [0.05, 0.7]),
    # A gap takes the last seen bucket's values, never a later one's.
    (_kv_rows([(100, 0.2), (101, 0.4), (121, 0.9)]), 5.0, 100.0, [0.3, 0.3, 0.3, 0.3, 0.9]),
    (_kv_rows([(100, 0.2), (131, 0.9), (112, 0.6)]), 10.0, 100.0, [0.2, 0.6, 0.6, 0.9]),
])
def test_rows_are_averaged_into_buckets(rows, step_s, start, expected_kv):
    series = Series.from_rows(rows, step_s)
    assert (series.start, series.step_s, len(series)) == (start, step_s, len(expected_kv))
    np.testing.assert_allclose(series.column(KV), expected_kv, rtol=1e-12, atol=1e-15)
    # Every column is averaged with the same rows.
    np.testing.assert_allclose(series.column("rss_bytes"), 1e9 * np.array(expected_kv), rtol=1e-12)
    np.testing.assert_allclose(series.column("waiting"), 2.0)


def test_each_column_keeps_its_own_values_in_a_gap():
    rows = [row(100, 0.2, scale=1), row(101, 0.4, scale=3), row(116, 0.9, scale=5)]
    series = Series.from_rows(rows, 5.0)
    expected = {"kv_cache_usage": (0.3, 0.9), "rss_bytes": (7e8, 4.5e9), "running": (7.0, 45.0),
                "waiting": (4.0, 10.0), "prompt_tokens": (70.0, 450.0),
                "generation_tokens": (100.0, 250.0), "finished": (6.0, 15.0),
                "preemptions": (0.0, 0.0)}
    assert set(expected) == set(COLUMNS)
    for name, (first, last) in expected.items():
        np.testing.assert_allclose(series.column(name), [first] * 3 + [last], rtol=1e-12,
                                   err_msg=name)


def test_no_rows_is_an_empty_series():
    series = Series.from_rows([], 5.0)
    assert len(series) == 0 and series.values.shape == (0, len(COLUMNS))


def test_head_tail_and_column():
    series = Series.from_rows(_kv_rows((100 + i, i / 10) for i in range(10)), 1.0)
    assert len(series.head(4)) == 4 and series.head(4).start == 100.0
    tail = series.tail(3)
    assert tail.start == 107.0 and tail.column(KV).tolist() == pytest.approx([0.7, 0.8, 0.9])
    assert series.tail(50).start == 100.0 and len(series.tail(50)) == 10
    with pytest.raises(KeyError, match="colour"):
        series.column("colour")


@pytest.mark.parametrize("horizon_s,step_s,steps", [(300, 5, 60), (60, 5, 12), (7, 5, 1),
                                                     (300, 7, 43), (1, 0.5, 2)])
def test_horizon_steps(horizon_s, step_s, steps):
    assert horizon_steps(horizon_s, step_s) == steps


@pytest.mark.parametrize("horizon_s,step_s", [(2, 5), (0, 5)])
def test_a_horizon_under_one_step_is_refused(horizon_s, step_s):
    with pytest.raises(ValueError, match="at least one step"):
        horizon_steps(horizon_s, step_s)


def test_series_sql_on_a_real_trace_log(tmp_path):
    import duckdb

    from observe.tracelog import TraceLog

    path = tmp_path / "trace.duckdb"
    with TraceLog(str(path)) as log:
        for s, kv in [(3, 0.3), (0, 0.0), (1, 0.1), (2, None), (7, 0.7)]:
            log.add("engine_stats", {"ts": T0 + s, "kv_cache_usage": kv, "running": s,
                                     "rss_bytes": 1000 * s})
    with duckdb.connect(str(path), read_only=True) as conn:
        rows = conn.execute(series_sql()).fetchall()
        later = conn.execute(series_sql(T0 + 2)).fetchall()
    assert [r[0] for r in rows] == [T0 + s for s in (0, 1, 2, 3, 7)]
    assert [r[0] for r in later] == [T0 + s for s in (2, 3, 7)]
    series = Series.from_rows(rows, 2.0)
    assert series.start == T0 and len(series) == 4
    np.testing.assert_allclose(series.column(KV), [0.05, 0.15, 0.15, 0.7])  # NULL reads 0
    np.testing.assert_allclose(series.column("rss_bytes"), [500, 2500, 2500, 7000])
    np.testing.assert_allclose(series.column("waiting"), 0.0)


# --- forecasters ---------------------------------------------------------------------

FORECASTERS = [
    lambda: LastValue(),
    lambda: EWMA(),
    lambda: Holt(),
    lambda: RidgeLags(lags=12),
    lambda: LSTMForecaster(window=12, epochs=3, hidden=8),
]
IDS = ["last_value", "ewma", "ets", "ridge_lags", "lstm"]


@pytest.mark.parametrize("factory", FORECASTERS, ids=IDS)
def test_a_forecast_never_sees_the_future(factory):
    h = 6
    series = make_series(periodic(300))
    model = factory().fit(series.head(200), KV, h)
    origins = np.array([0, 5, 11, 12, 150, 199, 230, 249])
    before = model.forecast(series, origins)
    assert before.shape == (len(origins),) and np.all(np.isfinite(before))
    changed = series.values.copy()
    rng = np.random.default_rng(9)
    changed[origins.max() + 1:] = rng.normal(0, 1e6, changed[origins.max() + 1:].shape)
    after = model.forecast(Series(series.start, series.step_s, changed), origins)
    np.testing.assert_array_equal(after, before)
    # Nor does a series cut right after the origin change anything.
    for origin, value in zip(origins, before):
        cut = model.forecast(series.head(int(origin) + 1), np.array([origin]))
        np.testing.assert_allclose(cut, [value], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("factory", FORECASTERS, ids=IDS)
def test_fit_reads_only_the_series_it_is_given(factory):
    series = make_series(periodic(300))
    changed = series.values.copy()
    changed[200:] *= 50
    a = factory().fit(series.head(200), KV, 6)
    b = factory().fit(Series(series.start, series.step_s, changed).head(200), KV, 6)
    origins = np.arange(150, 200)
    np.testing.assert_array_equal(a.forecast(series, origins), b.forecast(series, origins))


def test_last_value_is_the_value_at_the_origin():
    series = make_series(periodic(50))
    model = LastValue().fit(series, KV, 4)
    np.testing.assert_array_equal(model.forecast(series, np.array([0, 9, 49])),
                                  series.column(KV)[[0, 9, 49]])


def _ar_process(steps: int) -> np.ndarray:
    """Two sinusoids around an offset: an exact, noise-free linear recursion (AR(4)
    with intercept), so every value `h` ahead is linear in the last four."""
    t = np.arange(steps)
    return 0.5 + 0.2 * np.sin(2 * math.pi * t / 17) + 0.1 * np.cos(2 * math.pi * t / 40 + 1)


@pytest.mark.parametrize("horizon", [1, 5, 12])
def test_ridge_lags_recovers_an_exact_linear_process(horizon):
    y = _ar_process(600)
    series = make_series(y)
    model = RidgeLags(lags=12, penalty=1e-9).fit(series.head(400), KV, horizon)
    origins = np.arange(400, 600 - horizon)
    error = np.abs(model.forecast(series, origins) - y[origins + horizon])
    assert error.max() < 1e-5
    last = np.abs(LastValue().fit(series, KV, horizon).forecast(series, origins)
                  - y[origins + horizon])
    assert last.mean() > 0.01  # the test is not trivial


@pytest.mark.parametrize("kind,alpha", [("noise", min(ALPHAS)), ("walk", max(ALPHAS))])
def test_ewma_picks_its_alpha_from_the_grid(kind, alpha):
    rng = np.random.default_rng(3)
    steps = rng.normal(0, 0.01, 800)
    steps[0] = 0.0  # the smoothing starts at the first value: let it start at the level
    y = 0.5 + (steps if kind == "noise" else np.cumsum(steps))
    model = EWMA().fit(make_series(y), KV, 5)
    assert model.alpha in ALPHAS and model.alpha == alpha


def test_holt_follows_a_linear_trend_better_than_last_value():
    rng = np.random.default_rng(4)
    y = 0.1 + 0.002 * np.arange(400) + rng.normal(0, 0.002, 400)
    series, h = make_series(y), 12
    origins = np.arange(300, 400 - h)
    actual = y[origins + h]
    holt = np.abs(Holt().fit(series.head(300), KV, h).forecast(series, origins) - actual).mean()
    last = np.abs(LastValue().fit(series, KV, h).forecast(series, origins) - actual).mean()
    assert last == pytest.approx(0.024, abs=0.002)
    assert holt < 0.3 * last


def test_ridge_lags_needs_more_steps_than_its_lags():
    with pytest.raises(ValueError, match="ridge_lags needs more than"):
        RidgeLags(lags=12).fit(make_series(periodic(15)), KV, 4)


def test_lstm_needs_enough_windows():
    with pytest.raises(ValueError, match="lstm needs more than"):
        LSTMForecaster(window=12, epochs=1).fit(make_series(periodic(40)), KV, 10)


@pytest.mark.parametrize("anchor", [1, 5])
def test_a_zeroed_lstm_forecasts_its_anchor(anchor):
    """With the networks' outputs zeroed the forecast is exactly the mean of the last
    `anchor_steps` values (the last value for 1): training only learns the change."""
    series = make_series(periodic(200))
    model = LSTMForecaster(window=12, epochs=1, hidden=8, anchor_steps=anchor,
                           members=2).fit(series, KV, 6)
    model.states = [{k: np.zeros_like(v) for k, v in st.items()} for st in model.states]
    origins = np.array([20, 100, 199])
    y = series.column(KV)
    expected = [y[o + 1 - anchor:o + 1].mean() for o in origins]
    np.testing.assert_allclose(model.forecast(series, origins), expected, rtol=0, atol=1e-12)


# --- backtests -----------------------------------------------------------------------

CHEAP = lambda: [LastValue(), EWMA(), RidgeLags(lags=12)]


@pytest.mark.parametrize("steps,step_s,horizon_s,train_share", [
    (300, 5.0, 60.0, 0.6), (300, 5.0, 5.0, 0.5), (250, 10.0, 300.0, 0.7), (400, 5.0, 300.0, 0.6)])
def test_backtest_scores_every_origin_and_sorts_by_error(steps, step_s, horizon_s, train_share):
    series = make_series(periodic(steps), step_s=step_s)
    result = backtest(series, KV, horizon_s, train_share, refit_every=50, factory=CHEAP)
    h = horizon_steps(horizon_s, step_s)
    train_steps = int(steps * train_share)
    assert result.train_steps == train_steps
    assert (result.target, result.horizon_s, result.step_s) == (KV, horizon_s, step_s)
    assert sorted(s.name for s in result.scores) == ["ewma", "last_value", "ridge_lags"]
    assert all(s.origins == steps - train_steps - h for s in result.scores)
    maes = [s.mae for s in result.scores]
    assert maes == sorted(maes) and result.winner.mae == min(maes)
    assert all(0 < s.mae <= s.rmse for s in result.scores)
    assert result.margin() == pytest.approx(maes[0] / maes[1])
    described = result.describe()
    assert described["winner"] == result.winner.name
    assert [s["name"] for s in described["scores"]] == [s.name for s in result.scores]


def test_backtest_last_value_score_is_exact():
    y = np.arange(100, dtype=float) / 100  # +0.01 a step: last value is 0.01 * h behind
    result = backtest(make_series(y), KV, 25.0, 0.5, factory=lambda: [LastValue()])
    score = result.score("last_value")
    assert score.origins == 100 - 50 - 5
    assert score.mae == pytest.approx(0.05, abs=1e-12)
    assert score.rmse == pytest.approx(0.05, abs=1e-12)
    assert result.score("lstm") is None and result.margin() is None


def test_backtest_clips_forecasts_to_the_bounds():
    y = np.concatenate([np.linspace(0, 0.99, 90), np.full(30, 1.0)])  # rises then saturates
    result = backtest(make_series(y), KV, 50.0, 0.75, factory=lambda: [RidgeLags(lags=4)])
    assert (result.train_steps, result.winner.origins) == (90, 20)
    model = RidgeLags(lags=4).fit(make_series(y).head(91), KV, 10)  # the backtest's one fit
    preds = model.forecast(make_series(y), np.arange(90, 110))
    assert preds.max() > 1.0  # the line would run past a full cache ...
    clipped = np.minimum(preds, 1.0)
    assert result.winner.mae == pytest.approx(np.abs(clipped - 1.0).mean(), rel=1e-12)
    assert result.winner.mae < np.abs(preds - 1.0).mean()  # ... and clipping cuts the error


@pytest.mark.parametrize("steps,horizon_s,train_share", [(20, 60.0, 0.6), (13, 60.0, 0.1),
                                                         (100, 300.0, 0.6), (0, 5.0, 0.6)])
def test_backtest_refuses_a_series_too_short(steps, horizon_s, train_share):
    with pytest.raises(ValueError, match="too short"):
        backtest(make_series(periodic(steps)), KV, horizon_s, train_share, factory=CHEAP)


def test_backtest_with_the_lstm():
    series = make_series(periodic(240))
    result = backtest(series, KV, 30.0, 0.6, refit_every=100, factory=lambda: [
        LastValue(), LSTMForecaster(window=12, epochs=5, hidden=8)])
    lstm = result.score("lstm")
    assert lstm is not None and lstm.origins == 240 - 144 - 6
    assert math.isfinite(lstm.mae) and lstm.fit_s > 0
    assert {s.name for s in result.scores} == {"lstm", "last_value"}


# --- the forecaster the server runs --------------------------------------------------

def test_select_save_and_load_round_trip(tmp_path):
    series = make_series(periodic(300))
    chosen = MemoryForecaster.select(series, KV, 60.0, factory=CHEAP, refit_every=40)
    assert chosen.model.name == chosen.backtest.winner.name
    assert (chosen.target, chosen.horizon_s, chosen.step_s) == (KV, 60.0, 5.0)
    path = chosen.save(tmp_path / "m" / "memory-forecast.pkl")
    loaded = load_forecaster(path)
    assert loaded.model.name == chosen.model.name
    assert loaded.backtest == chosen.backtest
    for stop in (150, 250, 300):
        value = chosen.forecast_latest(series.head(stop))
        assert 0.0 <= value <= 1.0
        assert loaded.forecast_latest(series.head(stop)) == value


def test_the_winner_is_refitted_on_the_whole_series():
    series = make_series(periodic(300))
    chosen = MemoryForecaster.select(series, KV, 60.0, factory=lambda: [RidgeLags(lags=12)])
    refit = RidgeLags(lags=12).fit(series, KV, 12)
    np.testing.assert_array_equal(chosen.model.coef, refit.coef)


def test_a_saved_lstm_forecaster_round_trips(tmp_path):
    series = make_series(periodic(200))
    chosen = MemoryForecaster.select(series, KV, 30.0, refit_every=200, factory=lambda: [
        LSTMForecaster(window=12, epochs=2, hidden=8)])
    loaded = load_forecaster(chosen.save(tmp_path / "lstm.pkl"))
    assert loaded.forecast_latest(series) == chosen.forecast_latest(series)


def test_a_latency_model_file_is_not_a_forecaster(tmp_path):
    from slo import model_files

    path = model_files.save({"not": "a forecaster"}, tmp_path / "m.pkl", "latency model", 1)
    with pytest.raises(ValueError, match="not a tailguard memory forecaster"):
        load_forecaster(path)


@pytest.mark.parametrize("target,values,expected", [
    (KV, [-0.5, 0.0, 0.25, 1.0, 1.5], [0.0, 0.0, 0.25, 1.0, 1.0]),
    ("rss_bytes", [-5.0, 0.0, 1e12], [0.0, 0.0, 1e12]),
    ("running", [-5.0, 1e12], [-5.0, 1e12]),  # no bounds
])
def test_clip(target, values, expected):
    assert clip(target, np.array(values)).tolist() == expected


def test_bounds_cover_the_forecast_targets():
    from slo.forecast.series import TARGETS

    assert set(BOUNDS) == set(TARGETS)


def test_forecast_latest_is_clipped():
    y = np.concatenate([np.linspace(0.2, 0.99, 80), np.full(3, 0.995)])
    series = make_series(y)
    model = RidgeLags(lags=4).fit(series, KV, 10)
    raw = model.forecast(series, np.array([len(series) - 1]))[0]
    assert raw > 1.0
    chosen = MemoryForecaster(model, KV, 50.0, 5.0, backtest=None)
    assert chosen.forecast_latest(series) == 1.0
