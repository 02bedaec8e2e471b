"""One degradation policy's life: inactive -> active -> recovering -> inactive.

A policy trips when its condition has held for `trip_after_s`, stays active at least
`min_hold_s`, and, once the condition clears, recovers only after a quiet period
that starts at `backoff_s` (5 s) and doubles each time the condition comes back
during recovery (capped at `backoff_max_s`); a clean recovery resets it. The gap
between tripping and clearing thresholds (hysteresis) lives in each policy's
condition, not here.

Operators override a policy with force_on / force_off; the machine keeps running
underneath, so when an override ends (or expires) the automatic state is current.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

INACTIVE: Final = "inactive"
ACTIVE: Final = "active"
RECOVERING: Final = "recovering"
STATES: Final = (INACTIVE, ACTIVE, RECOVERING)

AUTO: Final = "auto"
FORCE_ON: Final = "force_on"
FORCE_OFF: Final = "force_off"
MODES: Final = (AUTO, FORCE_ON, FORCE_OFF)


@dataclass(frozen=True, slots=True)
class Timing:
    trip_after_s: float = 0.0
    min_hold_s: float = 10.0
    backoff_s: float = 5.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 160.0

    def __post_init__(self) -> None:
        if min(self.trip_after_s, self.min_hold_s) < 0 or self.backoff_s <= 0:
            raise ValueError("policy timings must be >= 0 and backoff_s > 0")
        if self.backoff_factor < 1 or self.backoff_max_s < self.backoff_s:
            raise ValueError("backoff_factor must be >= 1 and backoff_max_s >= backoff_s")


@dataclass(frozen=True, slots=True)
class Transition:
    policy: str
    from_state: str
    to_state: str
    reason: str
    details: dict
    at: float  # epoch seconds


@dataclass(frozen=True, slots=True)
class Override:
    mode: str
    reason: str
    actor: str
    created: float  # epoch seconds
    expires: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if not self.reason.strip():
            raise ValueError("an override needs a reason")

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


@dataclass(slots=True)
class PolicyMachine:
    name: str
    timing: Timing = field(default_factory=Timing)
    state: str = INACTIVE
    since: float = 0.0
    reason: str = ""  # why it last moved: what operators read next to the state
    backoff_s: float = 0.0
    breached_since: float | None = None
    recover_at: float = 0.0
    override: Override | None = None

    def __post_init__(self) -> None:
        self.backoff_s = self.timing.backoff_s

    def step(self, now: float, breached: bool, reason: str, details: dict) -> Transition | None:
        """Advance by one evaluation; the transition, if one happened."""
        if breached:
            self.breached_since = now if self.breached_since is None else self.breached_since
        else:
            self.breached_since = None
        if self.state == INACTIVE and breached:
            if now - self.breached_since >= self.timing.trip_after_s:
                return self._go(ACTIVE, now, reason, details)
        elif self.state == ACTIVE and not breached:
            if now - self.since >= self.timing.min_hold_s:
                self.recover_at = now + self.backoff_s
                return self._go(RECOVERING, now, f"condition cleared; recovery check in "
                                f"{self.backoff_s:g} s", details)
        elif self.state == RECOVERING:
            if breached:
                self.backoff_s = min(self.backoff_s * self.timing.backoff_factor,
                                     self.timing.backoff_max_s)
                return self._go(ACTIVE, now, f"relapse: {reason}", details)
            if now >= self.recover_at:
                self.backoff_s = self.timing.backoff_s
                return self._go(INACTIVE, now, "recovered: condition stayed clear", details)
        return None

    def _go(self, to_state: str, now: float, reason: str, details: dict) -> Transition:
        moved = Transition(self.name, self.state, to_state, reason, details, now)
        self.state, self.since, self.reason = to_state, now, reason
        return moved

    @property
    def effective(self) -> str:
        """The state decisions follow: an override's, else the machine's."""
        if self.override is None or self.override.mode == AUTO:
            return self.state
        return ACTIVE if self.override.mode == FORCE_ON else INACTIVE

    def expire_override(self, now: float) -> Override | None:
        """Drop an expired override; the one dropped, if any."""
        if self.override is not None and self.override.expired(now):
            gone, self.override = self.override, None
            return gone
        return None
