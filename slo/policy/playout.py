"""The engine's next steps played out prompt by prompt, as vLLM schedules them: the
prompts it has started first, then those waiting by engine priority and arrival; each
takes at most the adaptive cap (`EngineModel.chunk_cap`) of what the step's budget
leaves after one decode token per running sequence, and the rest of the budget goes
to the next; each step priced by the engine model with the attention pairs of each
prompt's own chunk (`attention_pairs(computed, chunk)`).

Two questions are asked of it: when does each prompt the engine holds get its first
token (`first_token_s`: admission's promises, `slo.policy.promises`), and when does a
newcomer behind given prompts get its own (`newcomer_steps`: the deadline check's
estimate, `slo.policy.feasibility`). Prompt by prompt, not as one sum of tokens: a
document's first chunks attend to few tokens and its last to many, and a short prompt
beside it finishes in a step or two while the document keeps taking its cap. The sums
put the steps of a 5x surge's queue at 1.6-2.7x what they took (docs/benchmarks.md,
"The estimate, prompt by prompt"). Under priorities the engine prefills VIP prompts
first (`serving.guard.vip_first`): a step with a VIP prompt in it is the VIPs' alone
(a lone one uncapped). KV-cache room and decodes that end mid-way are left out here
(`feasibility.kv_wait_s` adds the former).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from slo.sim.engine_model import EngineModel, attention_pairs

# Steps played out at most: past them `first_token_s` says never and `newcomer_steps`
# prices what is left as whole-budget steps in arrival order.
MAX_STEPS: Final = 64


@dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt in the engine (or about to enter it), as the scheduler sees it."""

    left: int  # tokens not yet prefilled
    computed: int  # tokens prefilled already
    priority: int  # engine priority: smaller first (`slo.sim.lanes.engine_priority`)
    started: bool  # vLLM has scheduled a chunk of it (it is running, served first)
    due_s: float = math.inf  # seconds from now to its first-token deadline
    arrives_s: float = 0.0  # seconds from now until it is in the engine (a booked retry)
    vip: bool = False  # a VIP's, under priorities: prefilled first (`step_chunks`)


def scheduling_order(prompts: Sequence[Prompt]) -> list[int]:
    """Indexes of `prompts` in vLLM's order: started first, then by priority, then as
    given (arrival)."""
    return sorted(range(len(prompts)),
                  key=lambda i: (not prompts[i].started, prompts[i].priority, i))


def first_token_s(model: EngineModel, decodes: int, prompts: list[Prompt],
                  step_remaining_s: float = 0.0) -> list[float]:
    """Seconds from now until each prompt's first token, if nothing else entered:
    after the step in progress, step by step in vLLM's order (inf: not within
    MAX_STEPS)."""
    order = scheduling_order(prompts)
    left = [p.left for p in prompts]
    done = [p.computed for p in prompts]
    vips = [p.vip for p in prompts]
    times = [0.0 if n <= 0 else math.inf for n in left]
    clock = step_remaining_s
    for _ in range(MAX_STEPS):
        pending = [i for i in order if left[i] > 0]
        if not pending:
            break
        active = [i for i in pending if prompts[i].arrives_s <= clock]
        if not active:  # an idle engine until the next one comes
            clock = min(prompts[i].arrives_s for i in pending)
            continue
        finished, chunks, tokens, pairs = step_chunks(model, decodes, active, left, done,
                                                      vips)
        clock += model.step_s(decodes + chunks, decodes + tokens, pairs)
        for i in finished:
            times[i] = clock
        decodes += len(finished)
    return times


def newcomer_steps(model: EngineModel, decodes: int, ahead: Sequence[Prompt],
                   tokens: int, vip: bool = False) -> tuple[float, int]:
    """Seconds of engine steps, from the end of the step in progress, until a newcomer
    of `tokens` prompt tokens entering now behind `ahead` (in the order given, or
    vLLM's where some are started) has its first token, nothing else entering; and
    the KV-cache tokens those steps take (every token they schedule: the prompts'
    chunks, its own included, and a token a decode): what must be free, or come free,
    for it to have its first token without a preemption. `vip`: the newcomer is a
    VIP's (under priorities)."""
    if tokens <= 0:
        return 0.0, 0
    prompts = [*ahead, Prompt(tokens, 0, math.inf, False, vip=vip)]  # behind all of them
    order, own = scheduling_order(prompts), len(prompts) - 1
    left = [p.left for p in prompts]
    done = [p.computed for p in prompts]
    vips = [p.vip for p in prompts]
    clock, taken = 0.0, 0
    for _ in range(MAX_STEPS):
        active = [i for i in order if left[i] > 0]
        finished, chunks, step_tokens, pairs = step_chunks(model, decodes, active, left, done,
                                                           vips)
        if not chunks:  # the decodes leave no token of a step for prefill
            return math.inf, taken
        clock += model.step_s(decodes + chunks, decodes + step_tokens, pairs)
        taken += decodes + step_tokens
        if left[own] <= 0:
            return clock, taken
        decodes += len(finished)
    rest = [i for i in order[:order.index(own) + 1] if left[i] > 0]
    lefts = [left[i] for i in rest]
    seconds = _whole_steps_s(model, decodes, lefts,
                             sum(attention_pairs(done[i], left[i]) for i in rest))
    return clock + seconds, taken + sum(lefts)


def _whole_steps_s(model: EngineModel, decodes: int, lefts: list[int], pairs: int) -> float:
    """Prefilling `lefts` one after another in whole-budget steps beside `decodes`."""
    tokens, room = sum(lefts), model.token_budget - decodes
    if room <= 0:
        return math.inf
    steps = -(-tokens // room)
    return model.steps_s(steps, decodes + 1, tokens + steps * decodes, pairs)


def step_chunks(model: EngineModel, decodes: int, active: list[int], left: list[int],
                done: list[int], vips: Sequence[bool] = ()) -> tuple[list[int], int, int, int]:
    """One step's prefill chunks for the `active` prompts (in scheduling order), taken
    off `left` (and added to `done`) in place: the prompts it finishes, how many
    chunks, their tokens and attention pairs. With a VIP's among them (`vips`, by
    index), the VIPs' alone, a lone one uncapped (`serving.guard.vip_first`)."""
    budget = model.token_budget - decodes
    cap = model.chunk_cap(decodes + len(active)) or budget
    if vips and any(vips[i] for i in active):
        active = [i for i in active if vips[i]]
        cap = budget if len(active) == 1 else cap
    finished, chunks, tokens, pairs = [], 0, 0, 0
    for i in active:
        take = min(left[i], cap, budget)
        if take <= 0:
            break
        pairs += attention_pairs(done[i], take)
        tokens, budget = tokens + take, budget - take
        left[i] -= take
        done[i] += take
        chunks += 1
        if left[i] <= 0:
            finished.append(i)
    return finished, chunks, tokens, pairs
