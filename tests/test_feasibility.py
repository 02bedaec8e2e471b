"""The deadline check (`slo.policy.feasibility`) against hand-computed cases: deadline,
work ahead and step remainder -> admit / truncate / best effort / refuse with the exact
Retry-After.

The engine model: a step costs 10 ms + 0.1 ms per scheduled token (nothing per
sequence), 1000 tokens a step, 20 ms per request outside steps. So a lone 500-token
prompt takes one 60 ms step (+20 ms) and a full step costs 110 ms.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from slo.policy import feasibility as F
from slo.sim.engine_model import EngineModel
from slo.sim.lanes import releases_p90

MODEL = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.0001,
                    step_per_pair_s=0.0, token_budget=1000, kv_capacity_tokens=100_000,
                    overhead_s=0.02)


def ahead(tokens=0, running=0, step=0.0, slot=0.0) -> F.WorkAhead:
    return F.WorkAhead(tokens, running, step, slot)


@pytest.mark.parametrize("prompt,work,expected_s", [
    (500, ahead(), 0.02 + 0.06),
    (1000, ahead(), 0.02 + 0.11),
    (1500, ahead(), 0.02 + 0.11 + 0.06),  # a full step, then 500 tokens
    (500, ahead(tokens=2500), 0.02 + 3 * 0.11),  # 3000 tokens: three full steps
    # 200 decodes take 200 tokens of every step: 800 prefill tokens a step
    (500, ahead(running=200), 0.02 + (0.01 + 0.0001 * 700)),
    (1000, ahead(running=200), 0.02 + 0.11 + (0.01 + 0.0001 * 400)),
    (500, ahead(step=0.05), 0.02 + 0.05 + 0.06),  # the step in progress first
    (500, ahead(slot=1.5), 0.02 + 1.5 + 0.06),  # then a concurrency slot
    (0, ahead(), 0.02),
])
def test_first_token_estimate(prompt, work, expected_s):
    assert F.first_token_s(MODEL, prompt, work) == pytest.approx(expected_s)


@pytest.mark.parametrize("prompt,work,left_s,kw,action,ttft_s,truncate_to,retry_after", [
    # feasible within the margin (by default all of the time left) -> admit
    (500, ahead(), 0.2, {}, F.ADMIT, 0.08, None, None),
    (500, ahead(), 0.081, {}, F.ADMIT, 0.08, None, None),  # 0.08 <= 1.0 x 0.081
    # just past it with nothing ahead: late even on an idle engine -> served best
    # effort (batch lane); refusing it would only mean never serving it
    (500, ahead(), 0.079, {}, F.BEST_EFFORT, 0.08, None, None),
    # the same request with the margin 0.8 (the default before issue 19's report)
    (500, ahead(), 0.1, {"margin": 0.8}, F.ADMIT, 0.08, None, None),  # 0.08 <= 0.8 x 0.1
    (500, ahead(), 0.099, {"margin": 0.8}, F.BEST_EFFORT, 0.08, None, None),
    # a queue: 2500 tokens ahead drain in 0.11 + 0.11 + 0.06 = 0.28 s -> 1 s
    (500, ahead(tokens=2500), 0.2, {}, F.REFUSE, 0.35, None, 1),
    # a long queue: 25,000 tokens ahead = 25 full steps = 2.75 s -> 3 s
    (500, ahead(tokens=25_000), 1.0, {}, F.REFUSE, 0.02 + 25 * 0.11 + 0.06, None, 3),
    # waiting for a slot: 5 s of it -> Retry-After 5 (the slot wait is ahead of it)
    (500, ahead(slot=5.0), 1.0, {}, F.REFUSE, 5.08, None, 5),
    # nothing released lately and no slot: infinite wait -> the longest Retry-After
    (500, ahead(slot=math.inf), 1.0, {}, F.REFUSE, math.inf, None, F.MAX_RETRY_AFTER_S),
    # truncating to 1000 tokens makes it fit (0.13 <= 0.3; the full prompt 0.35) -> truncate
    (3000, ahead(), 0.3, {"truncate_to": 1000}, F.TRUNCATE, 0.13, 1000, None),
    # ... but not when even the truncated prompt is late in the queue; the full prompt
    # is late on an idle engine too (0.35 s) -> best effort, not refused
    (3000, ahead(tokens=5000), 0.3, {"truncate_to": 1000}, F.BEST_EFFORT, 0.02 + 8 * 0.11,
     None, None),
    # truncation never lengthens a prompt
    (500, ahead(tokens=5000), 0.3, {"truncate_to": 1000}, F.REFUSE, 0.02 + 5.5 * 0.11 + 0.005,
     None, 1),
    # VIP: admitted however late (first in its lane; never refused for load)
    (500, ahead(tokens=25_000), 0.2, {"vip": True}, F.ADMIT, 0.02 + 25 * 0.11 + 0.06,
     None, None),
    # a sick engine (breaker L1): 3x slower -> 0.24 > 0.2 even idle; a healthy idle
    # engine would make it (0.08), so it is refused until the sickness passes
    (500, ahead(), 0.2, {"slowdown": 3.0}, F.REFUSE, 0.24, None, 1),
    # ... and its Retry-After scales too: 2.75 s x 3 -> 9 s
    (0, ahead(tokens=25_000), 0.2, {"slowdown": 3.0}, F.REFUSE, 3 * (0.02 + 25 * 0.11),
     None, 9),
    # a tighter margin turns away what the default admits
    (500, ahead(), 0.12, {"margin": 0.5}, F.BEST_EFFORT, 0.08, None, None),
    (500, ahead(tokens=500), 0.2, {"margin": 0.5}, F.REFUSE, 0.13, None, 1),
    # past its deadline already (negative time left): no wait helps -> best effort
    (1, ahead(), -0.5, {}, F.BEST_EFFORT, 0.02 + 0.0101, None, None),
    # late even idle while the check is refusing others (overloaded): deferred with the
    # drain time of what is ahead (5000 tokens: 5 full steps, 0.55 s -> 1 s; nothing
    # ahead -> 1 s at least), served best effort when it comes back
    (3000, ahead(tokens=5000), 0.3, {"overloaded": True}, F.DEFER, 0.02 + 8 * 0.11, None, 1),
    (3000, ahead(tokens=25_000), 0.3, {"overloaded": True}, F.DEFER,
     0.02 + 28 * 0.11, None, 3),
    (500, ahead(), 0.079, {"overloaded": True}, F.DEFER, 0.08, None, 1),
    # ... a truncation that fits still comes first, and a VIP is never deferred
    (3000, ahead(), 0.3, {"overloaded": True, "truncate_to": 1000}, F.TRUNCATE, 0.13, 1000,
     None),
    (3000, ahead(tokens=5000), 0.3, {"overloaded": True, "vip": True}, F.ADMIT,
     0.02 + 8 * 0.11, None, None),
    # feasible, or late only for the queue: overloaded changes nothing
    (500, ahead(), 0.081, {"overloaded": True}, F.ADMIT, 0.08, None, None),
    (500, ahead(tokens=2500), 0.2, {"overloaded": True}, F.REFUSE, 0.35, None, 1),
    # late only because of the queue, fine alone -> refused, to come back when drained:
    # 2000 tokens beside 10 decodes = two full steps of 990 + a step of 20 (and 10)
    (500, ahead(tokens=1500, running=10), 0.2, {}, F.REFUSE,
     0.02 + 2 * 0.11 + (0.01 + 0.0001 * 30), None, 1),
])
def test_judge(prompt, work, left_s, kw, action, ttft_s, truncate_to, retry_after):
    verdict = F.judge(MODEL, prompt, work, left_s, **kw)
    assert verdict.action == action
    assert verdict.ttft_s == pytest.approx(ttft_s)
    assert verdict.left_s == left_s
    assert verdict.truncate_to == truncate_to
    assert verdict.retry_after_s == retry_after


def test_retry_after_is_capped_and_whole():
    huge = ahead(tokens=10_000_000)
    assert F.retry_after_s(MODEL, huge) == F.MAX_RETRY_AFTER_S
    assert F.retry_after_s(MODEL, ahead(tokens=1000)) == 1  # 0.11 s rounds up to 1
    assert F.retry_after_s(MODEL, ahead(tokens=20_000)) == 3  # 2.2 s -> 3


# The same engine with attention: 10 ns per attention pair (a chunk of n tokens after c
# computed holds c*n + n(n+1)/2 pairs). A 1,000-token prompt alone: 500,500 pairs, 5 ms.
ATTENDING = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.0001,
                        step_per_pair_s=1e-8, token_budget=1000, kv_capacity_tokens=100_000,
                        overhead_s=0.02)
REST = 1000 * 500 + 500 * 501 // 2  # the last 500 tokens of a 1,500-token document


@pytest.mark.parametrize("prompt,work,expected_s", [
    # a lone prompt: its own pairs, whichever steps it is chunked into
    (1000, ahead(), 0.02 + 0.11 + 0.005005),
    (1500, ahead(), 0.02 + 0.11 + 0.06 + 1e-8 * (1500 * 1501 // 2)),
    # ahead of it, the last 500 tokens of a document 1,000 tokens in: as many tokens as a
    # fresh 500-token prompt, but attending to the 1,000 before them (6.25 ms, not 1.25)
    (500, F.WorkAhead(500, 0, prefill_pairs=REST),
     0.02 + 0.11 + 1e-8 * (REST + 500 * 501 // 2)),
    (500, F.WorkAhead(500, 0, prefill_pairs=500 * 501 // 2),
     0.02 + 0.11 + 1e-8 * (2 * (500 * 501 // 2))),
])
def test_first_token_estimate_charges_the_attention_pairs_left(prompt, work, expected_s):
    assert F.first_token_s(ATTENDING, prompt, work) == pytest.approx(expected_s)


@pytest.mark.parametrize("pairs,tokens,part,share", [
    (1000, 100, 25, 250), (1000, 100, 100, 1000), (1000, 100, 400, 1000), (1000, 0, 10, 0)])
def test_a_part_of_the_prompts_ahead_takes_its_share_of_their_pairs(pairs, tokens, part,
                                                                     share):
    assert F.share_of_pairs(pairs, tokens, part) == share


# The first engine under a per-request chunk cap of 250 tokens (vLLM's
# long_prefill_token_threshold): each prompt gets at most 250 tokens a step while
# another request is in the engine.
CAPPED = EngineModel(step_base_s=0.01, step_per_seq_s=0.0, step_per_token_s=0.0001,
                     step_per_pair_s=0.0, token_budget=1000, kv_capacity_tokens=100_000,
                     overhead_s=0.02, prefill_chunk_cap=250)


@pytest.mark.parametrize("prompt,work,expected_s", [
    # behind a 2,500-token document: its 500 tokens in two steps beside two of the
    # document's chunks (1,000 tokens in all), not after the whole document (0.35 s)
    (500, F.WorkAhead(2500, 0, prompts=1), 0.02 + 2 * 0.01 + 0.0001 * 1000),
    # alone in the engine: no cap, one step
    (500, F.WorkAhead(0, 0), 0.02 + 0.06),
    # beside 100 decodes the cap holds: two steps of 250 + 100
    (500, F.WorkAhead(0, 100), 0.02 + 2 * 0.01 + 0.0001 * 700),
    # four prompts ahead take the whole budget (4 x 250 + 250 > 1000): arrival order,
    # 4,500 tokens in four full steps and one of 500
    (500, F.WorkAhead(4000, 0, prompts=4), 0.02 + 4 * 0.11 + 0.06),
])
def test_under_a_chunk_cap_a_prompt_is_prefilled_beside_those_ahead(prompt, work,
                                                                     expected_s):
    assert F.first_token_s(CAPPED, prompt, work) == pytest.approx(expected_s)


# vLLM's adaptive cap (long_prefill_token_threshold_adaptive): never below the budget's
# fair share among the requests in the engine, so a light engine keeps big chunks.
ADAPTIVE = dataclasses.replace(CAPPED, prefill_cap_adaptive=True)


@pytest.mark.parametrize("in_engine,fixed,adaptive", [
    (0, 0, 0),
    (1, 0, 0),  # alone: no cap either way (nobody to starve)
    (2, 250, 500),  # a fair share of 1,000 between two is over the cap
    (3, 250, 333),
    (4, 250, 250),
    (10, 250, 250),  # the share (100) is under the cap: the cap holds
])
def test_the_chunk_cap_follows_vllms_rule(in_engine, fixed, adaptive):
    assert CAPPED.chunk_cap(in_engine) == fixed
    assert ADAPTIVE.chunk_cap(in_engine) == adaptive
    assert MODEL.chunk_cap(in_engine) == 0


def test_beside_one_decode_the_adaptive_cap_prefills_a_prompt_in_one_step():
    one_decode = F.WorkAhead(0, 1)
    assert F.first_token_s(ADAPTIVE, 500, one_decode) == pytest.approx(
        0.02 + 0.01 + 0.0001 * 501)
    assert F.first_token_s(CAPPED, 500, one_decode) == pytest.approx(
        0.02 + 2 * 0.01 + 0.0001 * 502)  # two chunks of 250, a decode beside each


# KV-cache room: vLLM starts a waiting prompt only once all of it fits the free KV cache
# (and none behind it before), so the unprefilled tokens ahead and its own must fit; the
# shortfall frees as running requests end, at the rate they freed it lately.
@pytest.mark.parametrize("ahead_tokens,prompt,free,rate,expected_s", [
    (0, 500, None, 0.0, 0.0),  # room not known: no wait
    (1000, 500, 1500, 0.0, 0.0),  # it all fits
    (1000, 500, 1000, 2000.0, 0.25),  # 500 short, 2,000 tokens freed a second
    (3000, 500, 500, 1000.0, 3.0),  # the documents ahead take the room first
    (1000, 500, 1000, 0.0, math.inf),  # short, and nothing has ended lately
])
def test_kv_wait_is_the_shortfall_over_the_rate_requests_free_it(ahead_tokens, prompt, free,
                                                                 rate, expected_s):
    work = F.WorkAhead(ahead_tokens, 4, kv_free_tokens=free, kv_free_rate=rate)
    assert F.kv_wait_s(work, prompt) == pytest.approx(expected_s)


# ... unless running requests due after it hold the room: vLLM preempts the one due last
# as soon as a running request finds no free block, so the wait is until the running
# requests have used up what is free, at the rate they take KV.
@pytest.mark.parametrize("free,preemptable,use_rate,release_rate,expected_s", [
    (400, 5000, 800.0, 100.0, 0.5),  # 1,100 short, all preemptable: 400 free used in 0.5 s
    (-200, 5000, 800.0, 100.0, 0.0),  # nothing free: the next block preempts at once
    (400, 600, 800.0, 100.0, 0.5 + 5.0),  # 500 short beyond what is preemptable
    (400, 5000, 0.0, 100.0, 11.0),  # nothing running takes KV: only ends free it
    (400, 0, 800.0, 100.0, 11.0),  # nobody due after it to preempt
])
def test_kv_held_by_requests_due_after_it_comes_free_once_the_free_room_is_used(
        free, preemptable, use_rate, release_rate, expected_s):
    work = F.WorkAhead(1000, 4, kv_free_tokens=free, kv_free_rate=release_rate,
                       kv_preemptable=preemptable, kv_use_rate=use_rate)
    assert F.kv_wait_s(work, 500) == pytest.approx(expected_s)


# Knowing how many requests ended (not only the tokens they freed), the wait for the
# releases that free the shortfall counts at its 90th percentile, as the slot wait:
# Gamma(k)'s (releases_p90: 2.2796 for one release, 6.6701 for four).
@pytest.mark.parametrize("short,freed,releases,expected_s", [
    (1000, 2000.0, 2.0, 2.2796 / 2),  # the mean release frees 1,000: one release
    (1000, 1000.0, 4.0, 6.6701 / 4),  # 250 a release: four
    (1001, 1000.0, 4.0, releases_p90(5) / 4),  # a token more: a fifth release
    (1000, 1000.0, 0.0, 1.0),  # the count not known: the mean, 1,000 at 1,000 a second
    (1000, 0.0, 4.0, math.inf),  # nothing freed lately
])
def test_the_kv_releases_wait_is_their_90th_percentile(short, freed, releases, expected_s):
    assert F.releases_wait_s(short, freed, releases) == pytest.approx(expected_s, rel=1e-4)


def test_the_kv_wait_counts_the_releases_beyond_the_next_victim_at_their_90th_percentile():
    # 1,100 short, 400 free used in 0.5 s; the victim's 600 leave 500, two releases of 250
    work = F.WorkAhead(1000, 4, kv_free_tokens=400, kv_free_rate=1000.0, kv_release_rate=4.0,
                       kv_preemptable=600, kv_use_rate=800.0)
    assert F.kv_wait_s(work, 500) == pytest.approx(0.5 + releases_p90(2) / 4)


def test_at_means_puts_the_slot_and_kv_release_waits_at_their_means():
    work = F.WorkAhead(0, 4, slot_wait_s=5.7, slot_wait_mean_s=2.5, kv_free_tokens=-500,
                       kv_free_rate=1000.0, kv_release_rate=4.0)
    assert F.kv_wait_s(work) == pytest.approx(releases_p90(2) / 4)
    mean = work.at_means()
    assert (mean.slot_wait_s, F.kv_wait_s(mean)) == (2.5, 0.5)  # 500 short at 1,000 a second
    # the mean not known: the slot wait as it is
    assert F.WorkAhead(0, 4, slot_wait_s=5.7).at_means().slot_wait_s == 5.7


def test_a_prompt_waiting_for_kv_room_is_refused_with_the_time_it_frees():
    # 1,000 tokens short at 2,000 a second: 0.5 s more than the prefill alone
    short = F.WorkAhead(0, 0, kv_free_tokens=-500, kv_free_rate=2000.0)
    assert F.first_token_s(MODEL, 500, short) == pytest.approx(0.02 + 0.06 + 0.5)
    check = F.judge(MODEL, 500, short, left_s=0.2)
    assert check.action == F.REFUSE and check.retry_after_s == 1  # room for it in 0.5 s
    # on an engine with room the same prompt is admitted
    assert F.judge(MODEL, 500, F.WorkAhead(0, 0, kv_free_tokens=600), 0.2).action == F.ADMIT
