"""The engine's next steps played out prompt by prompt (`slo.policy.playout`) against
hand-computed cases: when a newcomer behind given prompts has its first token.

The engine model: a step costs 10 ms + 1 ms per scheduled token (nothing per sequence
or pair), 1000 tokens a step, an adaptive chunk cap of 250 tokens (never below the
budget's fair share among the requests in the engine, none for a request alone);
ATTENDING also charges 10 ns per attention pair, with no cap.
"""

from __future__ import annotations

import math

import pytest

from slo.policy import feasibility as F
from slo.policy import playout
from slo.policy.playout import Prompt
from slo.sim.engine_model import EngineModel, attention_pairs

MODEL = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.001,
                    step_per_pair_s=0.0, token_budget=1000, kv_capacity_tokens=100_000,
                    prefill_chunk_cap=250, prefill_cap_adaptive=True)
ATTENDING = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.0001,
                        step_per_pair_s=1e-8, token_budget=1000, kv_capacity_tokens=100_000,
                        overhead_s=0.02)
WAITING_300 = Prompt(300, 0, 0, False)


@pytest.mark.parametrize("decodes,ahead,tokens,expected_s", [
    (0, [], 0, 0.0),  # no prompt: nothing to wait for
    (0, [], 500, 0.51),  # alone: no cap, one step of 500 tokens
    # beside a started document (two in the engine: the cap is the fair share, 500):
    # the document's 500 and its 300 in one step, not after the document's 2,500
    (0, [Prompt(2500, 1000, 0, True)], 300, 0.81),
    # behind four waiting prompts of 300 (five in the engine: the cap, 250): the first
    # step is theirs; in the second they finish (50 each) beside 250 of its own; in the
    # third it takes its last 50 beside the four decodes they have become
    (0, [WAITING_300] * 4, 300, 1.01 + (0.01 + 0.45) + (0.01 + 0.054)),
    (1000, [], 10, math.inf),  # the decodes leave no token of a step for prefill
])
def test_a_newcomer_gets_what_each_step_leaves_of_its_budget(decodes, ahead, tokens,
                                                             expected_s):
    assert playout.newcomer_steps(MODEL, decodes, ahead, tokens)[0] == pytest.approx(expected_s)


def test_a_newcomer_the_steps_do_not_finish_is_priced_as_whole_steps_after_them(monkeypatch):
    # 2,000 tokens beside a waiting 3,000-token document: 500 each a step; after two
    # steps (the most played out here) 2,000 of the document and 1,000 of its own are
    # left: three whole-budget steps in arrival order
    monkeypatch.setattr(playout, "MAX_STEPS", 2)
    got = playout.newcomer_steps(MODEL, 0, [Prompt(3000, 0, 0, False)], 2000)[0]
    assert got == pytest.approx(2 * 1.01 + 3 * 0.01 + 0.001 * 3000)


def test_each_prompt_pays_the_attention_pairs_of_its_own_chunk():
    """Behind the last 1,500 tokens of a document 1,000 tokens in: its next 1,000 tokens
    attend to the 1,000 before them and to each other, its last 500 to 2,000 more; the
    newcomer's 500 come in the second step. A share of the document's pairs in
    proportion to the tokens (what the sums knew) would charge the first step a third
    of the last 500's too."""
    doc = Prompt(1500, 1000, 0, True)
    first = 0.01 + 0.1 + 1e-8 * attention_pairs(1000, 1000)
    second = 0.01 + 0.1 + 1e-8 * (attention_pairs(2000, 500) + attention_pairs(0, 500))
    assert playout.newcomer_steps(ATTENDING, 0, [doc], 500)[0] == pytest.approx(first + second)
    work = F.WorkAhead(1500, 1, prefill_pairs=attention_pairs(1000, 1500), prompts=1,
                       queue=(doc,))  # the document is the one running sequence
    assert work.decodes == 0
    assert F.first_token_s(ATTENDING, 500, work) == pytest.approx(0.02 + first + second)


def test_a_request_kept_waiting_in_front_comes_after_every_prompt_ahead():
    # under a promise it does not share the steps: 1,500 + 500 tokens in two whole steps
    work = F.WorkAhead(1500, 1, prompts=1, shares_steps=False,
                       queue=(Prompt(1500, 1000, 0, True),))
    pairs = attention_pairs(1000, 1500) + attention_pairs(0, 500)
    assert F.first_token_s(ATTENDING, 500, work) == pytest.approx(
        0.02 + 2 * 0.01 + 0.0001 * 2000 + 1e-8 * pairs)


def test_work_added_ahead_joins_the_queue_as_one_fresh_prompt():
    work = F.WorkAhead(300, 0, prompts=1, queue=(WAITING_300,)).with_prefill(
        200, attention_pairs(0, 200))
    assert work.queue == (WAITING_300, Prompt(200, 0, 0, False))
    assert work.prefill_tokens == 500
    assert F.WorkAhead(0, 0).with_prefill(200, 1).queue is None  # the sums alone


def test_one_step_takes_the_started_prompts_first_then_the_waiting_by_priority():
    prompts = [Prompt(400, 0, 5, False), Prompt(100, 300, 9, True), Prompt(900, 0, 1, False)]
    order = playout.scheduling_order(prompts)
    assert order == [1, 2, 0]
    left, done = [p.left for p in prompts], [p.computed for p in prompts]
    # three in the engine: the cap is 333; the started one's 100, then 333 and 333
    finished, chunks, tokens, pairs = playout.step_chunks(MODEL, 0, order, left, done)
    assert (finished, chunks, tokens) == ([1], 3, 766)
    assert left == [67, 0, 567] and done == [333, 400, 333]
    assert pairs == (attention_pairs(300, 100) + attention_pairs(0, 333)
                     + attention_pairs(0, 333))


def test_the_kv_room_needed_is_what_the_steps_until_its_first_token_take():
    """Beside a started document (2,500 tokens left) a 300-token newcomer has its first
    token after one step of the document's 500 and its own 300: 800 tokens of KV
    cache, not the document's whole rest. With 500 free and 1,000 freed a second, 0.3 s
    (the sums: 2.3 s). With two decodes beside them the cap is 250: two steps."""
    doc = Prompt(2500, 1000, 0, True)
    assert playout.newcomer_steps(MODEL, 0, [doc], 300) == (pytest.approx(0.81), 800)
    assert playout.newcomer_steps(MODEL, 2, [doc], 300) == (pytest.approx(0.512 + 0.312),
                                                            502 + 302)
    work = F.WorkAhead(2500, 1, prompts=1, kv_free_tokens=500, kv_free_rate=1000.0,
                       queue=(doc,))  # the document is the one running sequence
    assert F.first_token_s(MODEL, 300, work) == pytest.approx(0.3 + 0.81)
    summed = F.WorkAhead(2500, 0, prompts=1, kv_free_tokens=500, kv_free_rate=1000.0)
    assert F.kv_wait_s(summed, 300) == pytest.approx(2.3)


@pytest.mark.parametrize("ahead,vip,expected_s", [
    # a VIP behind four started prompts of 300: its 300 take the first step alone
    # (uncapped), theirs the next two (250, then 50 beside the VIP's decode)
    ([Prompt(300, 0, 0, True)] * 4, True, 0.31),
    # the same newcomer not a VIP: the four take 250 each, it waits for the second step
    # (50 each and 250 of its own), and a third for its last 50 beside four decodes
    ([Prompt(300, 0, 0, True)] * 4, False, 1.01 + 0.46 + 0.064),
    # a realtime newcomer behind a waiting VIP prompt of 600 and a started document:
    # the VIP's step (600 alone), then the document's cap (a third of the budget: three
    # in the engine) and its own 300 beside the VIP's decode
    ([Prompt(2000, 0, 0, True), Prompt(600, 0, 0, False, vip=True)], False,
     0.61 + (0.01 + 0.001 * (333 + 300 + 1))),
])
def test_a_vip_prompt_takes_its_steps_alone_and_uncapped(ahead, vip, expected_s):
    assert playout.newcomer_steps(MODEL, 0, ahead, 300, vip)[0] == pytest.approx(expected_s)


def test_the_prompts_in_the_engine_wait_for_a_vip_prompt_among_them():
    times = playout.first_token_s(MODEL, 0, [Prompt(200, 0, 0, True),
                                             Prompt(900, 0, 0, False, vip=True)])
    assert times == pytest.approx([0.91 + 0.211, 0.91])  # the VIP's step, then the rest


def test_several_vip_prompts_keep_the_cap_among_them():
    """A short VIP beside a VIP document: both under the cap (the document does not take
    whole steps), a started realtime prompt left out."""
    times = playout.first_token_s(MODEL, 0, [Prompt(400, 0, 0, True),
                                             Prompt(2000, 0, 0, False, vip=True),
                                             Prompt(200, 0, 0, False, vip=True)])
    # three in the engine: the cap is a third of the budget (333); the VIPs 333 + 200
    assert times[2] == pytest.approx(0.01 + 0.533)
