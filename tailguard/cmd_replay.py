"""`tailguard replay`: what-if for policies and capacity on a recorded trace log (a
file no server holds), in simulated time on an engine model calibrated from it."""

from __future__ import annotations

import json

import click

from tailguard.clitools import TraceSource, one_line

ROWS_MAX = 20_000_000


def recording_query(db: str):
    return TraceSource(db=db).columns_and_rows(max_rows=ROWS_MAX, timeout_s=600)


def _policies(path: str | None):
    from serving.config import load_policy_config

    try:
        return load_policy_config(path)
    except ValueError as exc:
        raise click.UsageError(one_line(exc))


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers")
    if not values or min(values) < 1:
        raise click.BadParameter("replica counts are positive integers")
    return values


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers")
    if not values or min(values) <= 0:
        raise click.BadParameter("load factors are positive")
    return values


@click.command("replay")
@click.option("--db", required=True, type=click.Path(dir_okay=False),
              help="Recorded trace-log file, opened read-only.")
@click.option("--calibrate-from", "calibration_db", type=click.Path(dir_okay=False),
              help="Calibrate the engine model on this recording instead of --db (to "
                   "validate the simulator on a run it was not fitted to).")
@click.option("--policies", "candidate", type=click.Path(dir_okay=False),
              help="Candidate policy config (YAML) to compare with the baseline.")
@click.option("--baseline", type=click.Path(dir_okay=False),
              help="The policy config the run was recorded with (default: built-in).")
@click.option("--load", "loads", callback=lambda c, p, v: v and _float_list(v),
              help="Capacity mode: load factors, e.g. 10,100 (times the recorded rate).")
@click.option("--replicas", default="1,2,4,8,16,32,64,128", show_default=True,
              callback=lambda c, p, v: _int_list(v), help="Capacity mode: replica counts.")
@click.option("--chunk-cap", type=click.IntRange(min=0), default=256, show_default=True,
              help="The engine's per-request prefill chunk cap (vLLM's "
                   "--long-prefill-token-threshold; tailguard serve's default, 256, "
                   "adaptive); 0 for an engine without one.")
@click.option("--fixed-cap", is_flag=True,
              help="The cap as a fixed one (an engine run with "
                   "--no-long-prefill-token-threshold-adaptive).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def replay(db, calibration_db, candidate, baseline, loads, replicas, chunk_cap, fixed_cap,
           fmt):
    """Replay a recorded run through the policy engine on a calibrated engine model.

    No --policies: replays the run as recorded and reports the simulator's error
    against what happened. --policies FILE: baseline against candidate. --load:
    SLO attainment against replica count at that many times the recorded load.

    Example: tailguard replay --db run.duckdb --policies stricter.yaml
    Out of sample: tailguard replay --db tuesday.duckdb --calibrate-from monday.duckdb
    """
    from slo.sim.report import calibrated_recording, format_report, replay_report

    try:
        model, recorded = calibrated_recording(
            recording_query(db), recording_query(calibration_db) if calibration_db else None)
    except ValueError as exc:
        raise click.UsageError(one_line(exc))
    model = model.with_chunk_cap(chunk_cap, fixed_cap)
    base = _policies(baseline)
    chosen = _policies(candidate) if candidate and not loads else None  # --load wins
    result = replay_report(model, recorded, base, chosen, loads, replicas,
                           calibrated_on=calibration_db or db)
    click.echo(json.dumps(result, indent=1) if fmt == "json" else format_report(result),
               nl=False)
