"""vLLM's scheduler with VIP prompts first: while a VIP prompt waits or prefills in the
engine, each step is the VIP's (and the decodes') alone.

vLLM schedules its running requests before its waiting ones, each prompt at most the
chunk cap a step (256 tokens while others are there), whatever its priority. So a VIP
that arrives beside prompts already prefilling gets what their chunks leave of a step,
in 256-token pieces, each piece waiting for a full step: in a 10x surge (seeds
410-414) 22 of 31 late VIPs were estimated late on arrival, prompts under 1,000
tokens with a 0.2 s target taking 0.2-0.45 s beside 0-12 running requests. Here, a
step that has a VIP prompt to prefill leaves the other prompts' prefill out (they
keep their place and their KV cache, and go on the step after), runs the decodes,
and gives the VIP prompts the rest of the budget: a lone VIP prompt uncapped, several
under vLLM's cap (uncapped, a VIP document would take whole steps while a short VIP
due before it waits for them). Other prompts lose about one step per VIP prompt,
which admission charges them (VIPs in the engine, and those expected before a
newcomer's deadline, go ahead of it: `slo.policy.playout`, `slo.policy.vip_stream`).

A VIP is an engine request whose priority is in the VIP lane's range
(`slo.sim.lanes.engine_priority`); the rule acts only while some request in the
engine is outside that range (with the deadline policy off every priority is 0, and
vLLM's own schedule runs). Chosen by `serving.engine.setup.choose_scheduler`.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from slo.sim.lanes import vip_priority


def is_vip(request) -> bool:
    return vip_priority(request.priority)


def prefilling(request) -> bool:
    """Prompt tokens (or a resumed request's tokens) left to compute before it samples."""
    return request.num_tokens - request.num_computed_tokens > 1


def vip_prefills(running, waiting, free_tokens: int) -> tuple[int, int]:
    """The VIP prompts to prefill now, and their tokens: VIPs prefilling in the engine,
    and waiting VIPs whose prompts fit the `free_tokens` of KV cache (one that does not
    fit waits for room, and holding the others back would not bring it sooner); none
    when every request is in the VIP range (nothing to put after them)."""
    if all(is_vip(r) for r in running) and all(is_vip(r) for r in waiting):
        return 0, 0
    lefts = [r.num_tokens - r.num_computed_tokens for r in running
             if is_vip(r) and prefilling(r)]
    for r in waiting:  # in the engine's order: VIPs first
        left = r.num_tokens - r.num_computed_tokens
        if not is_vip(r) or left > free_tokens:
            break
        lefts.append(left)
        free_tokens -= left
    return len(lefts), sum(lefts)


class VipFirst:
    """The rule, over whichever vLLM scheduler it is mixed into."""

    def schedule(self, *args, **kwargs):
        free = self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size
        prompts, tokens = vip_prefills(self.running, self.waiting, free)
        if not prompts:
            return super().schedule(*args, **kwargs)
        order = self.running
        held = {id(r) for r in order if not is_vip(r) and prefilling(r)}
        decodes = sum(not prefilling(r) for r in order)
        budget = self.max_num_scheduled_tokens
        cap = self.scheduler_config.long_prefill_token_threshold
        self.running = [r for r in order if id(r) not in held]
        self.max_num_scheduled_tokens = min(budget, decodes + tokens)
        # a lone VIP prompt uncapped; several keep the cap, so that a VIP document does
        # not take whole steps while a short VIP due before it waits
        if prompts == 1:
            self.scheduler_config.long_prefill_token_threshold = 0
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = budget
            self.scheduler_config.long_prefill_token_threshold = cap
            self.running = _merged(order, held, self.running)


class VipFirstScheduler(VipFirst, Scheduler):
    pass


class VipFirstAsyncScheduler(VipFirst, AsyncScheduler):
    pass


def _merged(order: list, held: set[int], running: list) -> list:
    """The held requests back in their places: the old order, less those that left
    (preempted or finished), then the requests that started this step."""
    kept = {id(r) for r in running}
    before = {id(r) for r in order}
    return ([r for r in order if id(r) in held or id(r) in kept]
            + [r for r in running if id(r) not in before])
