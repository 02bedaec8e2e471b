"""Admission's promises kept: a prompt admitted to be on time is not made late by one
that enters the engine after it and is due later.

vLLM's chunked prefill with the adaptive per-request cap (our serve default) gives
every prompt the engine holds a chunk of each step, so a prompt that enters later
lengthens the steps of every prompt still prefilling there; the deadline check judged
those prompts on the work that was ahead of them, not on what would come beside them.
In a 5x design surge (seeds 1-3, policies on) 3 of the 9 admitted realtime requests
that missed had a document of 3-7k tokens, due after them, enter during their wait.

So before a request other than a VIP enters the engine, the limiter asks
`holds_back`: would its prompt push the first token of a prompt already there and due
before it past that prompt's deadline, when without it that prompt would be on time?
If so, it waits in front, in its lane's order, until the engine's prompts no longer
need the protection (each chunk and first token wakes the limiter). A prompt already
late is not protected: holding others back would not save it. VIPs are never held.

A refused request's booking (`slo.policy.retry_book`) is a promise too: its retry is a
prompt that arrives when its Retry-After ends, and a newcomer still prefilling then
would take steps it was promised. In a 10x surge (seed 1, policies on) 14 of the 18
retries refused again found a prompt of 1.1-3.9k tokens (not a VIP's), admitted after
their booking with a target of 0.7-1.5 s, prefilling in the engine when they came
back. So the prompts played out include the bookings due before the newcomer, each
entering at its time (`Prompt.arrives_s`).

Both answers come from playing the engine's next steps out as vLLM schedules them
(`first_token_s`): the prompts it has started first, then those waiting by engine
priority, each taking at most the adaptive cap of the step's budget after one decode
token per running sequence; each step priced by the live engine model. KV-cache room
and decodes that end are left out (a few steps ahead, neither moves much).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from slo.sim.engine_model import EngineModel, attention_pairs

# Steps played out at most: a prompt not done by then counts as never on time.
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


def first_token_s(model: EngineModel, decodes: int, prompts: list[Prompt],
                  step_remaining_s: float = 0.0) -> list[float]:
    """Seconds from now until each prompt's first token, if nothing else entered:
    after the step in progress, step by step in vLLM's order (inf: not within
    MAX_STEPS)."""
    order = sorted(range(len(prompts)),
                   key=lambda i: (not prompts[i].started, prompts[i].priority, i))
    left = [p.left for p in prompts]
    done = [p.computed for p in prompts]
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
        finished, chunks, tokens, pairs = _step(model, decodes, active, left, done)
        clock += model.step_s(decodes + chunks, decodes + tokens, pairs)
        for i in finished:
            times[i] = clock
        decodes += len(finished)
    return times


def _step(model: EngineModel, decodes: int, active: list[int], left: list[int],
          done: list[int]) -> tuple[list[int], int, int, int]:
    """One step's prefill chunks, taken off `left` in place: the prompts it finishes,
    how many chunks, their tokens and attention pairs."""
    budget = model.token_budget - decodes
    cap = model.chunk_cap(decodes + len(active)) or budget
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


def holds_back(model: EngineModel, decodes: int, prompts: list[Prompt], newcomer: Prompt,
               step_remaining_s: float = 0.0) -> bool:
    """Whether `newcomer` entering now would make a prompt due before it (a smaller
    engine priority) miss a deadline it would meet without it."""
    earlier = [i for i, p in enumerate(prompts) if p.priority < newcomer.priority]
    if not earlier:
        return False
    without = first_token_s(model, decodes, prompts, step_remaining_s)
    on_time = [i for i in earlier if without[i] <= prompts[i].due_s]
    if not on_time:
        return False
    beside = first_token_s(model, decodes, [*prompts, newcomer], step_remaining_s)
    return any(beside[i] > prompts[i].due_s for i in on_time)
