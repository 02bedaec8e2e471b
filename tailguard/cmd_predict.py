"""`tailguard predict` and `tailguard forecast`: train and judge the latency predictor
and the memory forecaster on a recorded trace log (a file no server holds)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slo.model_files import FORECAST_FILE, LATENCY_FILE, default_dir
from tailguard.clitools import TraceSource, one_line

ROWS_MAX = 5_000_000
_DB = click.option("--db", required=True, type=click.Path(dir_okay=False),
                   help="Trace-log file, opened read-only.")


def _rows(db: str, sql: str) -> list[tuple]:
    return TraceSource(db=db).checked(sql, max_rows=ROWS_MAX, timeout_s=300).rows


def _default_model(db: str, name: str) -> Path:
    return default_dir(db) / name


def _training_set(db: str):
    from slo.predict.features import TrainingSet, training_sql

    return TrainingSet.from_rows(_rows(db, training_sql()))


@click.group()
def predict():
    """Per-request latency predictor (TTFT/TPOT quantiles)."""


@predict.command("train")
@_DB
@click.option("--out", type=click.Path(dir_okay=False),
              help="Model file (default: DB.models/latency.pkl, where the server looks).")
@click.option("--holdout", type=click.FloatRange(0, 0.9), default=0.3, show_default=True,
              help="Newest share of requests kept out of training and judged; 0: train on all.")
def predict_train(db, out, holdout):
    """Train on the trace log's older requests; print accuracy on the newest."""
    from slo.predict.model import train

    data = _training_set(db)
    train_part, test_part = data.split(holdout) if holdout else (data, data.slice(0, 0))
    try:
        model = train(train_part)
    except ValueError as exc:
        raise click.UsageError(one_line(exc))
    path = model.save(out or _default_model(db, LATENCY_FILE))
    click.echo(f"trained {model.version} on {model.rows} requests -> {path}")
    if len(test_part):
        _print_accuracy(model, test_part)


@predict.command("eval")
@_DB
@click.option("--model", "model_file", type=click.Path(dir_okay=False),
              help="Model file (default: DB.models/latency.pkl).")
@click.option("--holdout", type=click.FloatRange(0.01, 1), default=0.3, show_default=True,
              help="Newest share of requests to judge on (1: all of them).")
def predict_eval(db, model_file, holdout):
    """Accuracy of a saved model and of the seed formula, and of what the server
    itself predicted (the rows' predicted_* columns)."""
    from slo.predict.model import load_model

    path = model_file or _default_model(db, LATENCY_FILE)
    try:
        model = load_model(path)
    except (OSError, ValueError) as exc:
        raise click.UsageError(one_line(exc))
    data = _training_set(db)
    test_part = data if holdout >= 1 else data.split(holdout)[1]
    _print_accuracy(model, test_part)
    click.echo("\nas served (the rows' own predictions):")
    click.echo(_served_accuracy(db))


def _print_accuracy(model, test_part) -> None:
    from slo.predict.accuracy import held_out_report

    click.echo(held_out_report(model, test_part))


def _served_accuracy(db: str) -> str:
    from slo.predict.accuracy import never_predicted_sql, served_accuracy_sql, served_report

    source = TraceSource(db=db)
    return served_report(*(source.checked(sql, timeout_s=120)
                           for sql in (served_accuracy_sql(), never_predicted_sql())))


FORECAST_EXTRA = "tailguard[forecast]"  # pyproject.toml's extra with PyTorch


@click.group()
def forecast():
    """KV-cache / memory forecaster (LSTM against baselines). Needs PyTorch:
    pip install 'tailguard[forecast]'."""
    try:
        import torch  # noqa: F401  (every subcommand fits or loads the LSTM)
    except ImportError:
        raise click.UsageError(f"tailguard forecast needs PyTorch for its LSTM: "
                               f"pip install '{FORECAST_EXTRA}'") from None


_TARGET = click.option("--target", type=click.Choice(["kv_cache_usage", "rss_bytes"]),
                       default="kv_cache_usage", show_default=True)
_HORIZON = click.option("--horizon", type=click.FloatRange(min=1), default=300.0,
                        show_default=True, help="Seconds ahead.")
_STEP = click.option("--step", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
                     help="Seconds per series step (engine_stats rows are averaged).")
_SHARE = click.option("--train-share", type=click.FloatRange(0.1, 0.95), default=0.6,
                      show_default=True, help="Share of the series before the first origin.")


def _series(db: str, step: float):
    from slo.forecast.series import Series, series_sql

    series = Series.from_rows(_rows(db, series_sql()), step)
    if not len(series):
        raise click.UsageError(f"{db}: no engine_stats rows")
    return series


@forecast.command("eval")
@_DB
@_TARGET
@_HORIZON
@_STEP
@_SHARE
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="First seed of the LSTM's members (to see how much a result owes "
                   "to the seed).")
@click.option("--json", "as_json", is_flag=True, help="Print the backtest as JSON.")
def forecast_eval(db, target, horizon, step, train_share, seed, as_json):
    """Rolling-origin backtest of the LSTM and the baselines."""
    from slo.forecast.backtest import all_forecasters, backtest

    try:
        result = backtest(_series(db, step), target, horizon, train_share,
                          factory=lambda: all_forecasters(seed))
    except ValueError as exc:
        raise click.UsageError(one_line(exc))
    click.echo(json.dumps(result.describe(), indent=2) if as_json else result.table())


@forecast.command("train")
@_DB
@_TARGET
@_HORIZON
@_STEP
@_SHARE
@click.option("--out", type=click.Path(dir_okay=False),
              help="Forecaster file (default: DB.models/memory-forecast.pkl).")
def forecast_train(db, target, horizon, step, train_share, out):
    """Backtest, then fit the winner on the whole series and save it."""
    from slo.forecast.forecaster import MemoryForecaster

    try:
        chosen = MemoryForecaster.select(_series(db, step), target, horizon,
                                         train_share=train_share)
    except ValueError as exc:
        raise click.UsageError(one_line(exc))
    click.echo(chosen.backtest.table())
    path = chosen.save(out or _default_model(db, FORECAST_FILE))
    click.echo(f"saved {chosen.model.name} -> {path}")

