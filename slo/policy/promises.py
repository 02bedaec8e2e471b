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
(`slo.policy.playout.first_token_s`), each step priced by the live engine model.
"""

from __future__ import annotations

from slo.policy.playout import Prompt, first_token_s
from slo.sim.engine_model import EngineModel


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
