"""Deadline feasibility: can a request's first token still come before its deadline,
given the work ahead of it in its lane? Admission asks this of every request (and
again while it waits for an engine slot); the simulator asks the same function.

The estimate is the engine model's (`slo.sim.engine_model`, calibrated live from the
step probe): the prompt tokens ahead of the request in its lane plus its own are
prefilled in steps of `token_budget - running` tokens (vLLM's chunked prefill shares
each step's budget with one decode token per running sequence), each step costing
`step_s(running + 1, tokens, pairs)`, after the remainder of the step in progress, the
expected wait for a concurrency slot and that for KV-cache room (`kv_wait_s`); plus
the per-request overhead outside steps.
The model is linear in tokens and attention pairs, so the steps' sum is their count
times the per-step terms plus the whole prefill's tokens and pairs: the pairs of the
work ahead are those left of each prompt (a document half prefilled has its dear half
left), which admission keeps beside the token counts. The decodes' attention over
their contexts is left out (a step of 16 decodes over 1.5k-token contexts: about 1 ms
here).

The rule, in order:
1. feasible (estimate within `margin` x the time left) -> admit;
2. a policy allows truncation and the truncated prompt is feasible -> truncate;
3. VIP -> admit anyway (first in its lane: nothing but VIP work is ahead of it, and
   a VIP request is never refused for load);
4. late even on an idle, healthy engine (its target is below what this engine can
   do for its length) -> best effort: served in the batch lane, since no wait would
   make it on time; but while the check is refusing requests that could be on time
   (`overloaded`: the engine has no room to spare) it is deferred: refused with 429
   and the drain time as Retry-After, to be served best effort once the surge has
   drained. Served during the surge, such prompts (long ones: a 2-3k-token prompt is
   0.5-1 s of this CPU's engine) take a chunk of every step for a second or more
   and make the requests beside them late: replayed on a 5x design surge, deferring
   them gave 1.44x the goodput with fewer requests refused in all (docs/policies.md).
   Late only because the engine is sick (the slowdown) is not this case: sickness
   passes, so such a request is refused with a Retry-After like one late for the queue;
5. otherwise refuse at once (429), with Retry-After the predicted drain time of the
   work ahead: by then the lane holds none of what made it late, and it can be on
   time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from slo.policy import playout
from slo.policy.playout import Prompt
from slo.sim.engine_model import EngineModel, attention_pairs
from slo.sim.lanes import releases_p90

ADMIT: Final = "admit"
TRUNCATE: Final = "truncate"
BEST_EFFORT: Final = "best_effort"
DEFER: Final = "defer"  # best effort, but not now: refused with the drain time
REFUSE: Final = "refuse"
# Admit when the estimate fits this share of the time left. 1.0 since issue 19's 3x
# report (docs/benchmarks.md, "The deadline margin"): 0.8 refused requests that would
# have been on time (precision 46-94%) and gave 11% less goodput at the median, with
# the admitted requests' attainment no better.
DEFAULT_MARGIN: Final = 1.0
MAX_RETRY_AFTER_S: Final = 120


@dataclass(frozen=True, slots=True)
class WorkAhead:
    """The engine's state as it bears on one request's first token."""

    prefill_tokens: int  # prompt tokens ahead of it in its lane, not yet prefilled
    running: int  # sequences in the engine (each takes a decode token per step)
    step_remaining_s: float = 0.0  # of the engine step in progress
    slot_wait_s: float = 0.0  # wait for a concurrency slot, its 90th percentile (0: one free)
    prefill_pairs: int = 0  # attention pairs left of those prompt tokens (`attention_pairs`)
    prompts: int = 0  # how many prompts those tokens are (what a per-request cap shares)
    # KV-cache room (tokens) once the step in progress has its chunk; None: not known
    kv_free_tokens: int | None = None
    kv_free_rate: float = 0.0  # KV tokens that ending requests freed a second, lately
    kv_release_rate: float = 0.0  # how many requests ended a second, lately (0: not known)
    # KV tokens the engine's next preemption frees for it (its victim is due after it),
    # and the KV tokens the running requests take a second (decodes and chunks)
    kv_preemptable: int = 0
    kv_use_rate: float = 0.0
    # False: it waits in front until the prompts ahead have their first tokens
    # (`slo.policy.promises`), so under a chunk cap it does not advance beside them
    shares_steps: bool = True
    # The same prompts one by one, in vLLM's order (started ones first, `playout`),
    # after the step in progress; None: only the sums above are known
    queue: tuple[Prompt, ...] | None = None
    own_vip: bool = False  # its own prompt is a VIP's, under priorities: prefilled first
    slot_wait_mean_s: float | None = None  # the slot wait's mean (None: `slot_wait_s`)

    def at_means(self) -> WorkAhead:
        """The same with its waits at their means, not their 90th percentiles: the input
        of the latency prediction, whose p50 is calibrated from it (the deadline check
        wants the tail). At the 90th percentiles, the requests that waited for a slot in
        two kept surge recordings had TTFT 0.65-0.77x the estimate, those that did not
        0.88-0.92x: one calibration cannot fit both (docs/benchmarks.md, "The KV wait
        at its 90th percentile")."""
        mean = self.slot_wait_s if self.slot_wait_mean_s is None else self.slot_wait_mean_s
        return replace(self, slot_wait_s=mean, kv_release_rate=0.0)

    def with_prefill(self, tokens: int, pairs: int, vip: bool = False) -> WorkAhead:
        """The same, with `tokens` more prompt tokens (holding `pairs` attention pairs)
        to prefill ahead: booked retries, VIPs still to come (`vip`: which the engine
        prefills first; one fresh prompt in the queue)."""
        if not tokens:
            return self
        queue = None if self.queue is None else \
            (*self.queue, Prompt(tokens, 0, 0, False, vip=vip))
        return replace(self, prefill_tokens=self.prefill_tokens + tokens,
                       prefill_pairs=self.prefill_pairs + pairs, queue=queue)

    @property
    def decodes(self) -> int:
        """Running sequences that decode (the rest of `running` are the queue's
        started prompts)."""
        started = 0 if self.queue is None else sum(p.started for p in self.queue)
        return max(0, self.running - started)


def queued(queue: list[Prompt], running: int, **rest) -> WorkAhead:
    """The work ahead of `queue`'s prompts, one by one and summed, beside `running`
    sequences; `rest`: the other fields of `WorkAhead`."""
    return WorkAhead(sum(p.left for p in queue), running,
                     prefill_pairs=sum(attention_pairs(p.computed, p.left) for p in queue),
                     prompts=len(queue), queue=tuple(queue), **rest)


@dataclass(frozen=True, slots=True)
class Feasibility:
    action: str  # ADMIT / TRUNCATE / BEST_EFFORT / DEFER / REFUSE
    ttft_s: float  # the estimated time to first token from now, as it will be sent
    left_s: float  # time left to its deadline
    truncate_to: int | None = None
    retry_after_s: int | None = None  # REFUSE and DEFER only


def prefill_s(model: EngineModel, tokens: int, running: int,
              pairs: int | None = None) -> float:
    """Engine time to prefill `tokens` prompt tokens holding `pairs` attention pairs
    (None: one fresh prompt of `tokens`) beside `running` decodes."""
    if tokens <= 0:
        return 0.0
    steps = -(-tokens // max(1, model.token_budget - running))
    pairs = attention_pairs(0, tokens) if pairs is None else pairs
    return model.steps_s(steps, running + 1, tokens + steps * running, pairs)


def share_of_pairs(pairs: int, tokens: int, part: int) -> int:
    """The attention pairs of `part` of `tokens` prompt tokens that hold `pairs`, taken
    in proportion (which prompts a part comes from is not known)."""
    if tokens <= 0:
        return 0
    return pairs if part >= tokens else pairs * part // tokens


def first_token_s(model: EngineModel, prompt_tokens: int, ahead: WorkAhead) -> float:
    """Estimated seconds from now to the request's first token."""
    steps_s, needed = own_prefill(model, prompt_tokens, ahead)
    return (model.overhead_s + ahead.step_remaining_s + ahead.slot_wait_s
            + kv_wait_s(ahead, needed=needed) + steps_s)


def alone(ahead: WorkAhead, prompt_tokens: int) -> bool:
    """Nothing but the step in progress stands between the request and its prefill:
    no prompt ahead, no wait for a slot or for KV-cache room."""
    return (not ahead.prefill_tokens and not ahead.slot_wait_s
            and not kv_wait_s(ahead, prompt_tokens))


def kv_wait_s(ahead: WorkAhead, prompt_tokens: int = 0, needed: int | None = None) -> float:
    """The wait for KV-cache room. vLLM starts a waiting prompt only when the whole of it
    fits the free KV cache, and starts none behind one that does not fit; a prompt half
    prefilled takes blocks for each further chunk. So the prompts ahead and its own
    need their unprefilled tokens free. A waiting prompt preempts nobody, but a running
    request that finds no free block does: vLLM then preempts the running request due
    last, frees its whole cache, and preempts no other until that room is used up. So
    once the running requests have used up what is free (at the rate they take KV), the
    next victim's cache comes free (`kv_preemptable`); any shortfall beyond that frees
    as requests end (`releases_wait_s`; infinite when none has ended lately). `needed`:
    the tokens that must fit, when known better than all of those
    (`playout.newcomer_steps`: what the steps until its first token take, not what
    prompts beside it take after it)."""
    if ahead.kv_free_tokens is None:
        return 0.0
    if needed is None:
        needed = ahead.prefill_tokens + prompt_tokens
    short = needed - ahead.kv_free_tokens
    if short <= 0:
        return 0.0
    wait = 0.0
    if ahead.kv_preemptable > 0 and ahead.kv_use_rate > 0:
        wait = max(0, ahead.kv_free_tokens) / ahead.kv_use_rate
        short -= ahead.kv_preemptable
        if short <= 0:
            return wait
    return wait + releases_wait_s(short, ahead.kv_free_rate, ahead.kv_release_rate)


def releases_wait_s(short: int, freed_per_s: float, releases_per_s: float) -> float:
    """The time until ending requests free `short` KV tokens, at the recent rates: the
    90th percentile of the wait for as many releases as the mean one frees that much
    (`releases_p90`, as the slot wait), not the mean; the mean where the release count is
    not known. Of the admitted realtime requests of two kept surge recordings that came
    with the KV cache 90% full or more and an estimate over half their target, 8 in 16
    missed it (docs/benchmarks.md, "The KV wait at its 90th percentile")."""
    if freed_per_s <= 0:
        return math.inf
    if releases_per_s <= 0:
        return short / freed_per_s
    count = math.ceil(short * releases_per_s / freed_per_s)
    return releases_p90(count) / releases_per_s


def own_prefill_s(model: EngineModel, prompt_tokens: int, ahead: WorkAhead) -> float:
    """Engine time until the request's prompt is prefilled. In arrival order, the
    prompts ahead first, then its own. Under a per-request chunk cap (vLLM's
    `long_prefill_token_threshold`, applied while another request is in the engine)
    every prompt gets at most `cap` tokens a step: its own advances from the first step
    beside those ahead, which take what their caps allow of each step meanwhile,
    as long as the step's budget holds them all; if it cannot, or it waits in front
    for them (`shares_steps` false), arrival order again."""
    return own_prefill(model, prompt_tokens, ahead)[0]


def own_prefill(model: EngineModel, prompt_tokens: int, ahead: WorkAhead) -> tuple[float, int]:
    """`own_prefill_s`, and the KV-cache tokens that must fit for it (`kv_wait_s`). Prompt
    by prompt (`ahead.queue`): the steps played out (`playout.newcomer_steps`), and the
    tokens they take until its first token, not what a document beside it takes after;
    waiting in front for those ahead, after all of them in whole-budget steps. From the
    sums alone: every token ahead and its own."""
    if ahead.queue is not None and ahead.shares_steps:
        return playout.newcomer_steps(model, ahead.decodes, ahead.queue, prompt_tokens,
                                      ahead.own_vip)
    every = ahead.prefill_tokens + prompt_tokens
    if ahead.queue is None:
        return _summed_prefill_s(model, prompt_tokens, ahead), every
    tokens = sum(p.left for p in ahead.queue) + prompt_tokens
    pairs = (sum(attention_pairs(p.computed, p.left) for p in ahead.queue)
             + attention_pairs(0, prompt_tokens))
    return prefill_s(model, tokens, ahead.decodes, pairs), every


def _summed_prefill_s(model: EngineModel, prompt_tokens: int, ahead: WorkAhead) -> float:
    """`own_prefill_s` from the sums of the prompts ahead."""
    cap = model.chunk_cap(ahead.running + ahead.prompts + 1)
    own_pairs, room = attention_pairs(0, prompt_tokens), model.token_budget - ahead.running
    beside = min(ahead.prompts * cap, ahead.prefill_tokens)  # ahead's tokens a step
    if not cap or not ahead.shares_steps or beside + min(cap, prompt_tokens) > room:
        return prefill_s(model, ahead.prefill_tokens + prompt_tokens, ahead.running,
                         ahead.prefill_pairs + own_pairs)
    if prompt_tokens <= 0:
        return 0.0
    steps = -(-prompt_tokens // cap)
    done_ahead = min(ahead.prefill_tokens, steps * beside)
    return model.steps_s(steps, ahead.running + ahead.prompts + 1,
                         steps * ahead.running + prompt_tokens + done_ahead,
                         own_pairs + share_of_pairs(ahead.prefill_pairs, ahead.prefill_tokens,
                                                    done_ahead))


def drain_s(model: EngineModel, ahead: WorkAhead, prompt_tokens: int = 0) -> float:
    """Seconds until the work ahead has been prefilled (no new arrivals), with KV-cache
    room for `prompt_tokens` more."""
    return (ahead.step_remaining_s + ahead.slot_wait_s + kv_wait_s(ahead, prompt_tokens)
            + prefill_s(model, ahead.prefill_tokens, ahead.running, ahead.prefill_pairs))


def retry_after_s(model: EngineModel, ahead: WorkAhead, slowdown: float = 1.0,
                  prompt_tokens: int = 0) -> int:
    """Whole seconds (HTTP's unit), at least 1, at most MAX_RETRY_AFTER_S."""
    drain = drain_s(model, ahead, prompt_tokens) * slowdown
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(drain))) if math.isfinite(drain) \
        else MAX_RETRY_AFTER_S


def judge(model: EngineModel, prompt_tokens: int, ahead: WorkAhead, left_s: float, *,
          vip: bool = False, truncate_to: int | None = None,
          margin: float = DEFAULT_MARGIN, slowdown: float = 1.0,
          overloaded: bool = False) -> Feasibility:
    """What admission does with a request `left_s` seconds before its deadline;
    `slowdown`: how many times slower than the model the engine runs now (a sick
    engine, breaker L1); `overloaded`: the check has been refusing requests lately."""
    budget = left_s * margin
    estimate = first_token_s(model, prompt_tokens, ahead) * slowdown
    if estimate <= budget:
        return Feasibility(ADMIT, estimate, left_s)
    if truncate_to is not None and prompt_tokens > truncate_to:
        shorter = first_token_s(model, truncate_to, ahead) * slowdown
        if shorter <= budget:
            return Feasibility(TRUNCATE, shorter, left_s, truncate_to=truncate_to)
    if vip:
        return Feasibility(ADMIT, estimate, left_s)
    unattainable = first_token_s(model, prompt_tokens, WorkAhead(0, 0)) > budget
    if unattainable and not overloaded:
        return Feasibility(BEST_EFFORT, estimate, left_s)
    return Feasibility(DEFER if unattainable else REFUSE, estimate, left_s,
                       retry_after_s=retry_after_s(model, ahead, slowdown, prompt_tokens))
