"""bench.policy.vip_bound: the late VIPs that no order could have saved, counted on the
simulator's engine model (the bench's arithmetic, on a made-up engine)."""

from __future__ import annotations

from bench.policy.vip_bound import bound_of_run, runs_of, table
from slo.sim.engine_model import EngineModel

# 10 ms a step plus 1 ms a token, 100 tokens a step: a 100-token prompt alone takes 0.11 s
ENGINE = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.001,
                     step_per_pair_s=0.0, token_budget=100, kv_capacity_tokens=10**6)


def row(t: float, vip: bool = True, ttft: float | None = 0.1, target: float = 0.15,
        prompt: int = 100) -> dict:
    return {"t": t, "vip": vip, "prompt_tokens": prompt, "output_tokens": 1,
            "max_tokens": 1, "priority": "realtime", "slo_ttft_target_s": target,
            "ttft_s": ttft, "shed": False, "predicted_ttft_s": None}


def test_runs_are_told_apart_by_a_pause_in_arrivals():
    rows = [row(0.0), row(1.0), row(4.9), row(10.0), row(10.5)]
    assert [[r["t"] for r in run] for run in runs_of(rows, gap_s=4.0)] == \
        [[0.0, 1.0, 4.9], [10.0, 10.5]]


def test_two_vips_due_at_once_one_is_late_under_any_order_neither_alone():
    # both 100-token prompts due 0.15 s after arriving together: one prefill fits
    # (0.11 s), the second ends at 0.22 s; each alone is on time. The server was late
    # with both (other traffic), and a realtime request does not count.
    run = [row(0.0, ttft=0.3), row(0.0, ttft=0.2), row(0.0, vip=False, ttft=9.0)]
    assert bound_of_run(ENGINE, run) == {"requests": 3, "vips": 2, "late_served": 2,
                                         "late_alone": 1, "late_isolated": 0}
    # a prompt that its own prefill makes late (0.31 s for 300 tokens) is late alone too
    long = [row(0.0, prompt=300, ttft=0.4)]
    assert bound_of_run(ENGINE, long)["late_isolated"] == 1


def test_the_table_sums_every_run():
    rows = [{"requests": 3, "vips": 2, "late_served": 2, "late_alone": 1, "late_isolated": 0},
            {"requests": 5, "vips": 1, "late_served": 0, "late_alone": 0, "late_isolated": 0}]
    assert table(rows).splitlines()[-1] == "| all | 8 | 3 | 2 | 1 | 0 |"
