"""From policy states to what admission does with the next request.

One immutable `Decisions` per evaluation: admission reads one object, so a request
never sees half of one second's decisions and half of the next's.
"""

from __future__ import annotations

from dataclasses import dataclass

from slo.policy import conditions as P
from slo.policy.lifecycle import ACTIVE, RECOVERING


@dataclass(frozen=True, slots=True)
class Decisions:
    concurrency_limit: int  # requests in the engine at once
    shed_non_vip: str | None = None  # the policy shedding non-VIP requests, if any
    restarting: bool = False  # breaker L2: the engine is being restarted
    max_tokens_cap: int | None = None
    truncate_tokens: int | None = None
    # The deadline check (`slo.policy.feasibility`) applies with this margin; None: off
    deadline_margin: float | None = None
    deadline_truncate_tokens: int | None = None  # it may truncate to this to fit
    # The prefill gate in engine steps' token budget (`serving.limiter`); None: off
    prefill_gate_steps: float | None = None
    # Later prompts wait in front while they would make an earlier one late (`promises`)
    keep_promises: bool = False
    # KV-cache tokens kept free for VIPs (`serving.limiter`); None: off
    vip_kv_reserve: int | None = None
    hold_retries: bool = False  # booked retries count as work ahead (`retry_book`)
    length_class_order: bool = False  # the lanes serve short length classes first
    # While breaker L1 holds, requests run this many times slower than the engine model
    # says: the deadline check scales its estimate by it.
    slowdown: float = 1.0
    refusing_late: bool = False  # the deadline check is refusing requests (its policy)
    memory_pressure: bool = False  # the concurrency limit is lowered for memory
    probing: bool = False  # breaker L1: a sick engine gets one request at a time
    recovering: bool = False  # breaker L1 recovering: batching restored gradually
    retry_after_s: int = 5

    @property
    def active(self) -> tuple[str, ...]:
        """Short names of what is in force (the policies banner)."""
        out = []
        if self.restarting:
            out.append(P.BREAKER_L2)
        if self.probing or self.recovering:
            out.append(P.BREAKER_L1)
        if self.shed_non_vip:
            out.append(self.shed_non_vip)
        if self.memory_pressure:
            out.append(P.MEMORY_PRESSURE)
        if self.max_tokens_cap is not None:
            out.append(P.TOKEN_CAP)
        if self.truncate_tokens is not None:
            out.append(P.TRUNCATION)
        if self.refusing_late:
            out.append(P.PREDICTED_MISS)
        return tuple(out)


def decide(states: dict[str, str], batch_limit: int, config: P.PolicyConfig,
           retry_after_s: float = 5.0, forced_off: frozenset[str] = frozenset(),
           slowdown: float = 1.0) -> Decisions:
    """`states`: each policy's effective state (override applied); `forced_off`: the
    policies an operator turned off (the deadline check applies unless it is);
    `slowdown`: how far off the engine model requests run (applied under breaker L1)."""
    def on(name: str) -> bool:
        return states.get(name) == ACTIVE

    limit = batch_limit
    if on(P.MEMORY_PRESSURE):
        limit = max(1, int(limit * config.memory_concurrency_factor))
    # Breaker L1 (a sick engine) lets one request at a time through, as a probe; while
    # it recovers, batching comes back gradually (half the limit). It sheds nobody by
    # itself: the deadline check, with its estimate scaled by the slowdown, refuses
    # exactly the requests the sick engine cannot serve in time.
    if on(P.BREAKER_L1):
        limit = 1
    elif states.get(P.BREAKER_L1) == RECOVERING:
        limit = max(1, limit // 2)
    shed = P.VIP_ONLY if on(P.VIP_ONLY) else None
    deadline_on = config.deadline_check and P.PREDICTED_MISS not in forced_off
    reserve = config.vip_kv_reserve_tokens
    if on(P.MEMORY_PRESSURE):
        reserve = max(reserve, config.memory_vip_kv_reserve_tokens)
    return Decisions(
        concurrency_limit=limit, shed_non_vip=shed, restarting=on(P.BREAKER_L2),
        max_tokens_cap=config.max_tokens_cap if on(P.TOKEN_CAP) else None,
        truncate_tokens=config.truncate_tokens if on(P.TRUNCATION) else None,
        deadline_margin=config.deadline_margin if deadline_on else None,
        prefill_gate_steps=(config.prefill_gate_steps
                            if deadline_on and config.prefill_gate_steps > 0 else None),
        keep_promises=deadline_on and config.keep_promises,
        vip_kv_reserve=reserve if deadline_on and reserve > 0 else None,
        hold_retries=deadline_on and config.hold_retries,
        length_class_order=config.length_class_order,
        deadline_truncate_tokens=(None if P.TRUNCATION in forced_off
                                  else config.truncate_tokens),
        memory_pressure=on(P.MEMORY_PRESSURE),
        probing=on(P.BREAKER_L1), recovering=states.get(P.BREAKER_L1) == RECOVERING,
        slowdown=max(1.0, slowdown) if on(P.BREAKER_L1) else 1.0,
        refusing_late=on(P.PREDICTED_MISS),
        retry_after_s=max(1, round(retry_after_s)))
