"""Admission's promises (`slo.policy.promises`) against hand-computed cases: the engine's
next steps played out as vLLM schedules them, and when a newcomer must wait in front.

The engine model: a step costs 10 ms + 1 ms per scheduled token (nothing per sequence
or pair), 1000 tokens a step, an adaptive chunk cap of 250 tokens (never below the
budget's fair share among the requests in the engine, none for a request alone).
"""

from __future__ import annotations

import math

import pytest

from slo.policy import feasibility as F
from slo.policy import playout, promises
from slo.policy.playout import Prompt
from slo.sim.engine_model import EngineModel

MODEL = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.001,
                    step_per_pair_s=0.0, token_budget=1000, kv_capacity_tokens=100_000,
                    prefill_chunk_cap=250, prefill_cap_adaptive=True)


@pytest.mark.parametrize("decodes,prompts,remaining,expected", [
    (0, [], 0.0, []),
    # alone: no cap, one step of 500 tokens
    (0, [Prompt(500, 0, 1, False)], 0.0, [0.51]),
    (0, [Prompt(500, 0, 1, False)], 0.2, [0.71]),  # after the step in progress
    # two prompts: the cap is the fair share, 500; the started one first although due
    # later; the second step has the first prompt's decode beside the rest
    (0, [Prompt(600, 0, 9, True), Prompt(300, 0, 1, False)], 0.0, [0.81 + 0.111, 0.81]),
    # two waiting, by priority; 800 decodes (800 tokens a step) leave 200 for prefill,
    # then 199 once the first has its first token and decodes too
    (800, [Prompt(300, 0, 2, False), Prompt(100, 0, 1, False)], 0.0,
     [1.01 + 1.01 + 0.812, 1.01]),
    (0, [Prompt(0, 40, 1, True)], 0.0, [0.0]),  # done already
])
def test_first_token_s(decodes, prompts, remaining, expected):
    got = playout.first_token_s(MODEL, decodes, prompts, remaining)
    assert got == pytest.approx(expected)


def test_a_prompt_the_steps_cannot_finish_is_never_on_time():
    # 1000 decodes leave no token of any step for prefill
    assert playout.first_token_s(MODEL, 1000, [Prompt(10, 0, 1, False)]) == [math.inf]


WAITING = Prompt(400, 0, 1, False, due_s=0.45)  # alone: first token at 0.41 s


@pytest.mark.parametrize("prompts,newcomer,held", [
    ([], Prompt(400, 0, 5, False, 1.0), False),  # nothing in the engine
    ([WAITING], Prompt(400, 0, 5, False, 1.0), True),  # 0.81 s beside it: late
    ([WAITING], Prompt(30, 0, 5, False, 1.0), False),  # 0.44 s beside it: on time
    ([WAITING], Prompt(400, 0, 0, False, 0.3), False),  # the newcomer is due first
    ([Prompt(400, 0, 1, False, due_s=0.3)], Prompt(400, 0, 5, False, 1.0), False),  # late anyway
    ([Prompt(400, 0, 1, False, due_s=1.0)], Prompt(400, 0, 5, False, 2.0), False),  # slack
    # of two earlier prompts, the one late anyway is not protected, the other is
    ([Prompt(400, 0, 1, False, due_s=0.2), Prompt(100, 0, 2, False, due_s=0.6)],
     Prompt(900, 0, 5, False, 2.0), True),
])
def test_holds_back(prompts, newcomer, held):
    assert promises.holds_back(MODEL, 0, prompts, newcomer) is held


def test_a_held_newcomer_is_estimated_after_the_prompts_ahead():
    """Held in front, it does not advance beside the prompts ahead under the cap: its
    estimate is theirs, then its own (`shares_steps`)."""
    ahead = F.WorkAhead(400, 0, prompts=1)
    model = MODEL
    beside = F.own_prefill_s(model, 400, ahead)
    after = F.own_prefill_s(model, 400, F.WorkAhead(400, 0, prompts=1, shares_steps=False))
    assert beside == pytest.approx(0.01 + 0.8)  # cap 500: both in one step
    assert after == pytest.approx(0.01 + 0.8)  # 800 tokens in one step either way
    long_ahead = F.WorkAhead(1600, 0, prompts=1)
    assert F.own_prefill_s(model, 400, long_ahead) == pytest.approx(0.01 + 0.9)
    assert F.own_prefill_s(model, 400, F.WorkAhead(1600, 0, prompts=1, shares_steps=False)) \
        == pytest.approx(2 * 0.01 + 2.0)


# A booked retry of 100 tokens, due back in 0.5 s, its first token due 0.2 s later.
BOOKED = Prompt(100, 0, 1, False, due_s=0.7, arrives_s=0.5)


@pytest.mark.parametrize("prompts,expected", [
    # idle until it comes, then one step of 100 tokens
    ([BOOKED], [0.61]),
    # a 2,000-token prompt alone for its first step (no cap, 1,000 tokens: 1.01 s);
    # then both, the booked one first by priority, the cap the fair share of two (500):
    # 100 + 500 tokens (0.61 s); then the rest beside one decode (501 tokens, 0.511 s)
    ([Prompt(2000, 0, 5, False), BOOKED], [1.01 + 0.61 + 0.511, 1.01 + 0.61]),
])
def test_a_booked_retry_enters_the_steps_when_it_comes(prompts, expected):
    assert playout.first_token_s(MODEL, 0, prompts) == pytest.approx(expected)


@pytest.mark.parametrize("newcomer,held", [
    (Prompt(2000, 0, 5, False, 3.0), True),  # still prefilling when it comes: 1.62 s
    (Prompt(300, 0, 5, False, 3.0), False),  # done at 0.31 s, before it comes
    (Prompt(2000, 0, 0, False, 3.0), False),  # due first (a smaller priority)
])
def test_a_newcomer_is_held_for_a_booked_retry(newcomer, held):
    assert promises.holds_back(MODEL, 0, [BOOKED], newcomer) is held
