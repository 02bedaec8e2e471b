"""The degradation policies: each a condition on the live signals, with SPEC §3's
thresholds as defaults, and hysteresis (a policy clears at a lower level than it
trips, so it does not flap at the edge).

The conditions only say "breached or not, and why"; `slo.policy.lifecycle.PolicyMachine` turns
that into states with hold times and back-off, and `slo.policy.decisions` turns states into
what admission does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Final

from slo.policy.lifecycle import Timing

BREAKER_L1: Final = "breaker_l1"
BREAKER_L2: Final = "breaker_l2"
TOKEN_CAP: Final = "token_cap"
VIP_ONLY: Final = "vip_only"
MEMORY_PRESSURE: Final = "memory_pressure"
TRUNCATION: Final = "truncation"
PREDICTED_MISS: Final = "predicted_miss"
BATCH_CONTROL: Final = "batch_control"


@dataclass(frozen=True, slots=True)
class Signals:
    """What the server measured, as of one evaluation (in-memory windows)."""

    now: float  # epoch seconds
    p99_s: float | None  # TTFT P99 over the breaker window, all buckets
    error_rate: float  # 5xx share of requests finished in the window
    engine_failed: bool
    queue_depth: int  # requests admitted with no first token yet (slot, engine queue, prefill)
    load: float  # engine busy share of wall time, 0..1
    kv_usage: float
    kv_forecast: float | None
    requests: int  # finished in the window (a P99 of 3 samples is no signal)
    kv_exhaustion_s: float | None = None  # seconds to a full KV cache at its trend; None: flat


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Thresholds (SPEC §3 defaults). Each `*_clear` is where an active policy lets go."""

    breaker_p99_s: float = 1.5
    breaker_p99_clear_s: float = 1.0
    breaker_for_s: float = 30.0
    breaker_min_requests: int = 10
    queue_depth: int = 5
    queue_depth_clear: int = 2
    max_tokens_cap: int = 256
    load: float = 0.8
    load_clear: float = 0.7
    vip_only_for_s: float = 120.0
    memory: float = 0.9
    memory_clear: float = 0.8
    memory_concurrency_factor: float = 0.5
    # Ahead of time: the KV cache would be full (vLLM preempts) within this many seconds
    # at the trend of the last KV_TREND_S; 0 turns it off. Clears above the second.
    memory_exhaustion_s: float = 60.0
    memory_exhaustion_clear_s: float = 120.0
    # Below this usage the trend alone does not trip: a burst into an empty cache climbs
    # steeply for seconds and stops; preemption is a risk only once the cache is half full.
    memory_exhaustion_floor: float = 0.5
    truncate_tokens: int = 4096
    predicted_miss_factor: float = 2.0  # predicted TTFT over target x this is a far miss
    batch_p99_s: float = 0.5
    batch_window_s: float = 5.0
    batch_windows: int = 3
    batch_low_utilisation: float = 0.6
    batch_cut: float = 0.8
    batch_raise: float = 1.2
    batch_floor: int = 8
    batch_cap: int = 64
    batch_initial: int = 16
    min_hold_s: float = 10.0
    backoff_s: float = 5.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"policy setting {f.name} must be >= 0")
        for trip, clear in (("breaker_p99_s", "breaker_p99_clear_s"), ("load", "load_clear"),
                            ("memory", "memory_clear"), ("queue_depth", "queue_depth_clear")):
            if getattr(self, clear) > getattr(self, trip):
                raise ValueError(f"{clear} must not exceed {trip} (hysteresis)")
        if self.memory_exhaustion_clear_s < self.memory_exhaustion_s:
            raise ValueError("memory_exhaustion_clear_s must not be below memory_exhaustion_s "
                             "(hysteresis: a policy clears once full is further away)")
        if not 1 <= self.batch_floor <= self.batch_cap:
            raise ValueError("batch_floor must be between 1 and batch_cap")
        if not self.batch_floor <= self.batch_initial <= self.batch_cap:
            raise ValueError("batch_initial must be between batch_floor and batch_cap")

    def timing(self, trip_after_s: float = 0.0, min_hold_s: float | None = None) -> Timing:
        hold = self.min_hold_s if min_hold_s is None else min_hold_s
        return Timing(trip_after_s=trip_after_s, min_hold_s=hold, backoff_s=self.backoff_s)


# A condition: (signals, config, currently active?) -> (breached, reason, details)
Condition = Callable[[Signals, PolicyConfig, bool], tuple[bool, str, dict]]


def breaker_l1(s: Signals, c: PolicyConfig, active: bool):
    limit = c.breaker_p99_clear_s if active else c.breaker_p99_s
    enough = s.requests >= c.breaker_min_requests
    breached = enough and s.p99_s is not None and s.p99_s > limit
    return breached, f"TTFT P99 {_fmt(s.p99_s)} s vs {limit:g} s", {
        "p99_s": s.p99_s, "requests": s.requests, "threshold_s": limit}


def breaker_l2(s: Signals, c: PolicyConfig, active: bool):
    """`engine_failed` stays true while the engine is being restarted, so the breaker
    holds exactly as long as the engine is out (no minimum hold: see the table)."""
    return s.engine_failed, "engine failed" if s.engine_failed else "engine healthy", {}


def token_cap(s: Signals, c: PolicyConfig, active: bool):
    limit = c.queue_depth_clear if active else c.queue_depth
    return s.queue_depth > limit, f"queue depth {s.queue_depth} vs {limit}", {
        "queue_depth": s.queue_depth, "threshold": limit, "cap": c.max_tokens_cap}


def overloaded(s: Signals, c: PolicyConfig, active: bool):
    limit = c.load_clear if active else c.load
    return s.load > limit, f"load {s.load:.0%} vs {limit:.0%}", {
        "load": s.load, "threshold": limit}


def memory_pressure(s: Signals, c: PolicyConfig, active: bool):
    """The KV cache high (measured or forecast), or on a trend to full soon: acting
    before vLLM starts preempting, not after."""
    limit = c.memory_clear if active else c.memory
    worst = max(s.kv_usage, s.kv_forecast or 0.0)
    which = "forecast" if (s.kv_forecast or 0.0) > s.kv_usage else "measured"
    soon = c.memory_exhaustion_clear_s if active else c.memory_exhaustion_s
    details = {"kv_usage": s.kv_usage, "kv_forecast": s.kv_forecast, "threshold": limit,
               "kv_exhaustion_s": s.kv_exhaustion_s}
    if worst > limit:
        return True, f"KV-cache {which} {worst:.0%} vs {limit:.0%}", details
    trending = s.kv_exhaustion_s is not None and s.kv_usage >= c.memory_exhaustion_floor
    if trending and s.kv_exhaustion_s < soon:
        return True, f"KV-cache full in {s.kv_exhaustion_s:.0f} s at its trend vs {soon:.0f} s", \
            details
    return False, f"KV-cache {which} {worst:.0%} vs {limit:.0%}", details


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def policy_table(c: PolicyConfig) -> dict[str, tuple[Condition, Timing]]:
    """Every automatic policy: its condition and timing. Batch control is a
    controller, not an on/off policy (see `slo.policy.batch_size`)."""
    return {
        BREAKER_L1: (breaker_l1, c.timing(c.breaker_for_s)),
        # no hold: a restarted, warm engine serves at once (its condition covers the
        # restart itself)
        BREAKER_L2: (breaker_l2, c.timing(min_hold_s=0.0)),
        TOKEN_CAP: (token_cap, c.timing()),
        VIP_ONLY: (overloaded, c.timing(c.vip_only_for_s)),
        MEMORY_PRESSURE: (memory_pressure, c.timing()),
        TRUNCATION: (overloaded, c.timing()),
        PREDICTED_MISS: (overloaded, c.timing()),
    }
