"""One request as the simulator sees it: its shape and target as recorded, and what
the simulated replica did with it (admission's actions, its prefill and decode)."""

from __future__ import annotations

from dataclasses import dataclass, field

from observe import registry as R
from slo.policy.playout import Prompt
from slo.sim.lanes import deadline_of, vip_priority
from slo.tenants import SHED_ERROR, SHED_PREFIXES

OK, REJECTED = R.STATUS_OK, R.STATUS_REJECTED


@dataclass(slots=True)
class SimRequest:
    arrival: float  # seconds from the start of the trace
    prompt: int
    output: int  # tokens it would generate if not capped
    max_tokens: int | None = None
    priority: str = R.PRIORITY_REALTIME
    vip: bool = False
    target_s: float | None = None  # its TTFT target
    predicted_ttft_s: float | None = None  # the server's prediction at admission, if known
    booked: bool = False  # a refused request back for its booking (`retry:booked`)
    status: str = OK
    first_token: float | None = None
    end: float | None = None
    context: int = 0  # tokens its (next) prefill computes: the prompt, or after a
    prefilled: int = 0  # preemption the prompt plus what it had generated
    generated: int = 0
    decoded: int = 0  # tokens generated since its last prefill (KV beyond `context`)
    started: bool = False  # its prefill began: it holds KV
    admitted: float | None = None
    engine_priority: int = 0  # vLLM's order for it (smaller first; `lanes.engine_priority`)
    actions: list[str] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def pending_prompt(self, now: float, priority: int | None = None) -> Prompt:
        """Its prefill as admission's promise keeper sees it (`slo.policy.promises`),
        with its engine priority or `priority` (one not yet in the engine)."""
        priority = self.engine_priority if priority is None else priority
        return Prompt(max(0, (self.context or self.prompt) - self.prefilled), self.prefilled,
                      priority, self.started, deadline_of(self) - now, vip=vip_priority(priority))

    @property
    def shed(self) -> bool:
        """Refused by a policy or the limiter's timeout (not by the engine's size)."""
        return self.status == REJECTED and any(
            a.startswith(SHED_PREFIXES) or a == SHED_ERROR
            for a in self.actions)

    @property
    def good(self) -> bool:
        return (self.status == OK and self.ttft_s is not None
                and (self.target_s is None or self.ttft_s <= self.target_s))
