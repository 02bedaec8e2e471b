"""A replay's answer (`tailguard replay`): the calibrated engine model and what the
replay found, as JSON and as the text table the command prints.

Three kinds of answer, by what was asked: the run against its own outcome (the
simulator's error), a baseline policy config against a candidate, or SLO attainment by
replica count at some multiple of the recorded load (slo.sim.replay says how each is
simulated).
"""

from __future__ import annotations

from collections.abc import Sequence

from slo.policy.conditions import PolicyConfig
from slo.sim import replay as rp
from slo.sim.engine_model import EngineModel, Query, calibrate

# The outcome rows of a validate or compare answer, in the order printed.
SHOWN = ("requests", "attainment", "goodput_rps", "shed_rate", "ttft_p50_s", "ttft_p99_s")
SCALE_HEADINGS = ("load", "replicas", "attainment", "shed", "ttft p99 s", "fleet goodput/s")


def calibrated_recording(query: Query, calibration: Query | None = None
                         ) -> tuple[EngineModel, rp.Recorded]:
    """The engine model (fitted on `calibration`, default the recording itself) and the
    recorded arrivals; ValueError when a log has too little to fit or replay."""
    model = calibrate(calibration or query)
    return model, rp.load_recorded(query)


def replay_report(model: EngineModel, recorded: rp.Recorded, baseline: PolicyConfig,
                  candidate: PolicyConfig | None = None, loads: list[float] | None = None,
                  replicas: Sequence[int] = (1,), calibrated_on: str = "") -> dict:
    """With `loads`: attainment by replica count at each load. With `candidate`: the
    baseline against it. Else: the run replayed against what really happened."""
    if loads:
        answer = {"scale": [row for load in loads
                            for row in rp.scale(model, baseline, recorded, load, replicas)]}
    elif candidate is not None:
        answer = rp.compare(model, baseline, candidate, recorded)
    else:
        answer = rp.validate(model, baseline, recorded)
    result = {"model": model.describe(), **answer}
    result["model"]["calibrated_on"] = calibrated_on
    return result


def format_report(result: dict) -> str:
    """The answer as `tailguard replay` prints it: the engine model, then the table."""
    head = _model_line(result["model"])
    if "scale" in result:
        return head + _scale_table(result["scale"])
    columns = {k: result[k] for k in ("actual", "simulated", "baseline", "candidate")
               if k in result}
    text = head + _outcome_table(columns)
    if "error" in result:
        e = result["error"]
        text += (f"simulated - actual: attainment {100 * e['attainment']:+.2f} pts, goodput "
                 f"{e['goodput_rps']:+.3f}/s, shed {100 * e['shed_rate']:+.2f} pts, TTFT p50 "
                 f"{e['ttft_p50_s'] * 1e3:+.1f} ms, p99 {e['ttft_p99_s'] * 1e3:+.1f} ms\n")
    return text


def _model_line(m: dict) -> str:
    return (f"engine model (calibrated on {m['calibrated_on']}): step = "
            f"{m['step_base_s'] * 1e3:.2f} ms + {m['step_per_seq_s'] * 1e6:.0f} us/seq + "
            f"{m['step_per_token_s'] * 1e6:.1f} us/token + "
            f"{m['step_per_pair_s'] * 1e9:.1f} ns/attention pair (R^2 {m['fit_r2']:.2f} over "
            f"{m['steps_fitted']} steps), budget {m['token_budget']} tokens/step, KV "
            f"{m['kv_capacity_tokens']} tokens, overhead {m['overhead_s'] * 1e3:.1f} ms\n")


def _scale_table(scale: list[dict]) -> str:
    rows = [list(SCALE_HEADINGS)]
    rows += [[f"{r['load']:g}x", str(r["replicas"]), f"{r['attainment']:.2%}",
              f"{r['shed_rate']:.2%}", f"{r['ttft_p99_s']:.3f}",
              f"{r['fleet_goodput_rps']:.1f}"] for r in scale]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows) + "\n"


def _outcome_table(columns: dict[str, dict]) -> str:
    names = list(columns)
    lines = [["", *names]] + [[k, *(_cell(k, columns[n][k]) for n in names)] for k in SHOWN]
    widths = [max(len(row[i]) for row in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in lines) + "\n"


def _cell(key: str, value) -> str:
    if key == "requests":
        return str(value)
    if key in ("attainment", "shed_rate"):
        return f"{value:.2%}"
    return f"{value:.4f}"
