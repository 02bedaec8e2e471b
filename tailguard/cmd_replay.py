"""`tailguard replay`: what-if for policies and capacity on a recorded trace log (a
file no server holds), in simulated time on an engine model calibrated from it."""

from __future__ import annotations

import json

import click

from tailguard.clitools import one_line

ROWS_MAX = 20_000_000
SHOWN = ("requests", "attainment", "goodput_rps", "shed_rate", "ttft_p50_s", "ttft_p99_s")


def _query(db: str):
    from observe.query import QueryError, query_file

    def run(sql: str):
        try:
            result = query_file(db, sql, max_rows=ROWS_MAX, timeout_s=600)
        except QueryError as exc:
            raise click.UsageError(one_line(exc))
        return result.columns, result.rows

    return run


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


def _table(columns: dict[str, dict]) -> str:
    names = list(columns)
    lines = [["", *names]] + [[k, *(_fmt(k, columns[n][k]) for n in names)] for k in SHOWN]
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in lines) + "\n"


def _fmt(key: str, value) -> str:
    if key == "requests":
        return str(value)
    if key in ("attainment", "shed_rate"):
        return f"{value:.2%}"
    return f"{value:.4f}"


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
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def replay(db, calibration_db, candidate, baseline, loads, replicas, fmt):
    """Replay a recorded run through the policy engine on a calibrated engine model.

    No --policies: replays the run as recorded and reports the simulator's error
    against what happened. --policies FILE: baseline against candidate. --load:
    SLO attainment against replica count at that many times the recorded load.

    Example: tailguard replay --db run.duckdb --policies stricter.yaml
    Out of sample: tailguard replay --db tuesday.duckdb --calibrate-from monday.duckdb
    """
    from slo.sim import replay as rp
    from slo.sim.engine_model import calibrate

    query = _query(db)
    try:
        model = calibrate(_query(calibration_db) if calibration_db else query)
        recorded = rp.load_recorded(query)
    except ValueError as exc:
        raise click.UsageError(one_line(exc))
    base = _policies(baseline)
    if loads:
        result = {"model": model.describe(), "scale": [
            row for load in loads for row in rp.scale(model, base, recorded, load, replicas)]}
    elif candidate:
        result = {"model": model.describe(),
                  **rp.compare(model, base, _policies(candidate), recorded)}
    else:
        result = {"model": model.describe(), **rp.validate(model, base, recorded)}
    result["model"]["calibrated_on"] = calibration_db or db
    click.echo(json.dumps(result, indent=1) if fmt == "json" else _render(result), nl=False)


def _render(result: dict) -> str:
    m = result["model"]
    head = (f"engine model (calibrated on {m['calibrated_on']}): step = {m['step_base_s'] * 1e3:.2f} ms + "
            f"{m['step_per_seq_s'] * 1e6:.0f} us/seq + {m['step_per_token_s'] * 1e6:.1f} us/token"
            f" (R^2 {m['fit_r2']:.2f} over {m['steps_fitted']} steps), budget "
            f"{m['token_budget']} tokens/step, KV {m['kv_capacity_tokens']} tokens, "
            f"overhead {m['overhead_s'] * 1e3:.1f} ms\n")
    if "scale" in result:
        rows = [["load", "replicas", "attainment", "shed", "ttft p99 s", "fleet goodput/s"]]
        rows += [[f"{r['load']:g}x", str(r["replicas"]), f"{r['attainment']:.2%}",
                  f"{r['shed_rate']:.2%}", f"{r['ttft_p99_s']:.3f}",
                  f"{r['fleet_goodput_rps']:.1f}"] for r in result["scale"]]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return head + "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths))
                                for r in rows) + "\n"
    columns = {k: result[k] for k in ("actual", "simulated", "baseline", "candidate")
               if k in result}
    text = head + _table(columns)
    if "error" in result:
        e = result["error"]
        text += (f"simulated - actual: attainment {100 * e['attainment']:+.2f} pts, goodput "
                 f"{e['goodput_rps']:+.3f}/s, shed {100 * e['shed_rate']:+.2f} pts, TTFT p50 "
                 f"{e['ttft_p50_s'] * 1e3:+.1f} ms, p99 {e['ttft_p99_s'] * 1e3:+.1f} ms\n")
    return text
