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
    predicted_miss_factor: float | None = None  # demote/shed far predicted misses
    memory_pressure: bool = False  # the concurrency limit is lowered for memory
    recovering: bool = False  # breaker L1 recovering: batching restored gradually
    retry_after_s: int = 5

    @property
    def active(self) -> tuple[str, ...]:
        """Short names of what is in force (the policies banner)."""
        out = []
        if self.restarting:
            out.append(P.BREAKER_L2)
        if self.shed_non_vip:
            out.append(self.shed_non_vip)
        elif self.recovering:
            out.append(P.BREAKER_L1)
        if self.memory_pressure:
            out.append(P.MEMORY_PRESSURE)
        if self.max_tokens_cap is not None:
            out.append(P.TOKEN_CAP)
        if self.truncate_tokens is not None:
            out.append(P.TRUNCATION)
        if self.predicted_miss_factor is not None:
            out.append(P.PREDICTED_MISS)
        return tuple(out)


def decide(states: dict[str, str], batch_limit: int, config: P.PolicyConfig,
           retry_after_s: float = 5.0) -> Decisions:
    """`states`: each policy's effective state (override applied)."""
    def on(name: str) -> bool:
        return states.get(name) == ACTIVE

    limit = batch_limit
    if on(P.MEMORY_PRESSURE):
        limit = max(1, int(limit * config.memory_concurrency_factor))
    # Breaker L1 stops batching; while it recovers, batching comes back gradually
    # (half the limit) and nobody is shed.
    if on(P.BREAKER_L1):
        limit = 1
    elif states.get(P.BREAKER_L1) == RECOVERING:
        limit = max(1, limit // 2)
    shed = P.BREAKER_L1 if on(P.BREAKER_L1) else P.VIP_ONLY if on(P.VIP_ONLY) else None
    return Decisions(
        concurrency_limit=limit, shed_non_vip=shed, restarting=on(P.BREAKER_L2),
        max_tokens_cap=config.max_tokens_cap if on(P.TOKEN_CAP) else None,
        truncate_tokens=config.truncate_tokens if on(P.TRUNCATION) else None,
        predicted_miss_factor=(config.predicted_miss_factor if on(P.PREDICTED_MISS)
                               else None),
        memory_pressure=on(P.MEMORY_PRESSURE),
        recovering=states.get(P.BREAKER_L1) == RECOVERING,
        retry_after_s=max(1, round(retry_after_s)))
