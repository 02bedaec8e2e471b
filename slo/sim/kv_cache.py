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
    """KV tokens the engine's next preemption frees for a waiting request with engine
    `priority` (None: none counted): vLLM preempts one started request at a time, only
    when a running one finds no free block, and none then until that room is used up,
    so only the next victim's cache comes free in time; none if it is due before the
    request (it would take its room back first)."""
    started = [r for r in running if r.started]
    if priority is None or not started:
        return 0
    victim = _victim(started)
    return held(victim) if victim.engine_priority > priority else 0


def _victim(started: list[SimRequest]) -> SimRequest:
    """The started request vLLM preempts next: due last, the newest among equals."""
    return max(reversed(started), key=lambda r: r.engine_priority)


def make_room(running: list[SimRequest], capacity: int) -> list[SimRequest]:
    """The requests decoding this step; while their next tokens do not fit, preempt
    the started request due last (the newest among equals)."""
    while True:
        decoding = [r for r in running if r.started and r.prefilled >= r.context]
        if allocated(running) + len(decoding) <= capacity:
            return decoding
        victim = _victim([r for r in running if r.started])
        victim.started, victim.prefilled, victim.decoded = False, 0, 0
        victim.context = victim.prompt + victim.generated  # recomputed when resumed
        victim.actions.append("preempted")
