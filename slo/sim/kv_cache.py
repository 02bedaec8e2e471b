"""vLLM's KV cache as the simulator keeps it (vLLM 0.32's v1 scheduler, read in
`vllm/v1/core/sched/scheduler.py`): blocks are taken chunk by chunk as a prompt is
prefilled and token by token as it decodes; a waiting prompt starts only when all of
it fits what is free (`scheduler_reserve_full_isl`) and preempts nobody; a running
request that finds no free block preempts the running request due last (with
priority scheduling the largest priority, ties the newest; first-come order the
newest), whose whole cache comes free and whose work is recomputed when it resumes.
"""

from __future__ import annotations

from slo.sim.request import SimRequest


def held(r: SimRequest) -> int:
    """KV tokens a started request holds: what it has computed of its context, and the
    tokens it decoded since."""
    return min(r.prefilled, r.context) + r.decoded


def allocated(running: list[SimRequest]) -> int:
    """KV tokens the engine holds: what its started requests have computed."""
    return sum(held(r) for r in running if r.started)


def preemptable(running: list[SimRequest], priority: int | None) -> int:
    """KV tokens held by started requests vLLM preempts before one with engine
    `priority` (theirs is larger; None: none counted)."""
    if priority is None:
        return 0
    return sum(held(r) for r in running if r.started and r.engine_priority > priority)


def make_room(running: list[SimRequest], capacity: int) -> list[SimRequest]:
    """The requests decoding this step; while their next tokens do not fit, preempt
    the started request due last (the newest among equals)."""
    while True:
        decoding = [r for r in running if r.started and r.prefilled >= r.context]
        if allocated(running) + len(decoding) <= capacity:
            return decoding
        started = [r for r in running if r.started]
        victim = max(reversed(started), key=lambda r: r.engine_priority)
        victim.started, victim.prefilled, victim.decoded = False, 0, 0
        victim.context = victim.prompt + victim.generated  # recomputed when resumed
        victim.actions.append("preempted")
