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

from slo.policy.feasibility import DEFAULT_MARGIN
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
    # Engine sickness (breaker L1): observed TTFT over the engine model's estimate made
    # at admission, the median over the window (None: too few requests); and how long
    # the engine has taken no step while requests wait for it.
    off_model: float | None = None
    stalled_s: float = 0.0
    deadline_refusals: int = 0  # requests the deadline check refused since the last one


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Thresholds (SPEC §3 defaults). Each `*_clear` is where an active policy lets go."""

    # Breaker L1 trips on sickness, never on load (load is the deadline check's job):
    # requests far slower than the engine model says they should be, 5xx errors, or
    # no engine step while requests wait.
    breaker_off_model: float = 3.0
    breaker_off_model_clear: float = 1.5
    breaker_error_rate: float = 0.5
    breaker_error_rate_clear: float = 0.2
    breaker_stall_s: float = 5.0
    breaker_for_s: float = 10.0
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
    # The deadline check admits a request when its estimated first token fits this
    # share of the time to its deadline (`slo.policy.feasibility`); below 1 it keeps
    # slack for the estimate's error at the cost of refusing some on-time requests.
    deadline_margin: float = DEFAULT_MARGIN
    # false: the deadline check is off from the start (as forcing predicted_miss off
    # does at run time), for a server that must answer every request however late
    deadline_check: bool = True
    # With the deadline check on, a request enters the engine only while the prompt
    # tokens there not yet prefilled, its own included, fit in this many engine steps'
    # token budget (`serving.limiter`: the rest wait in front, in lane and deadline
    # order, instead of in vLLM's arrival order); 0: no prefill gate
    prefill_gate_steps: float = 1.0
    # With the deadline check on, a request other than a VIP waits in front of the
    # engine while its prompt would make one already there, due before it, miss a
    # deadline it would meet without it (`slo.policy.promises`)
    keep_promises: bool = True
    # With the deadline check on, requests other than VIPs enter the engine only while
    # its KV cache keeps this many tokens free beyond their prompts (`serving.limiter`),
    # so a VIP arriving into a busy engine finds room at once; 0 (the default): no
    # reserve (with vLLM's priority scheduling it lifted no VIP figure: docs/benchmarks.md)
    vip_kv_reserve_tokens: int = 0
    # While memory pressure holds (and the deadline check is on), the VIP reserve rises
    # to at least this many tokens: the cache's last room goes to the VIPs rather than
    # to more non-VIP prompts (0: memory pressure keeps no reserve)
    memory_vip_kv_reserve_tokens: int = 0
    # A refused request's Retry-After comes after the bookings before it
    # (`slo.policy.retry_book`); true: its prompt also counts as work ahead of newcomers
    # until it comes back, so the time promised is kept (retries on time, at the cost
    # of refusing more first attempts during a surge: docs/benchmarks.md)
    hold_retries: bool = False
    # true: each limiter lane serves seed 000's short length class first, then medium,
    # then long, by deadline within a class (`slo.policy.length_classes`); false (the
    # default): by deadline alone (the measurement: docs/benchmarks.md)
    length_class_order: bool = False
    # The limiter's bounds on waiting in front of the engine: the longest a request
    # waits for a slot before a 503 `admission_timeout`, and how many may wait at once
    # before a 503 `queue_full` (0: no bound). Seed 001's hot path waits at most 0.5 s,
    # its cold path queues at most 64 (`tailguard serve --path-profile`).
    queue_wait_s: float = 120.0
    max_queue: int = 0
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
        for flag in ("deadline_check", "hold_retries", "length_class_order", "keep_promises"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false")
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"policy setting {f.name} must be >= 0")
        for trip, clear in (("breaker_off_model", "breaker_off_model_clear"),
                            ("breaker_error_rate", "breaker_error_rate_clear"),
                            ("load", "load_clear"),
                            ("memory", "memory_clear"), ("queue_depth", "queue_depth_clear")):
            if getattr(self, clear) > getattr(self, trip):
                raise ValueError(f"{clear} must not exceed {trip} (hysteresis)")
        if self.memory_exhaustion_clear_s < self.memory_exhaustion_s:
            raise ValueError("memory_exhaustion_clear_s must not be below memory_exhaustion_s "
                             "(hysteresis: a policy clears once full is further away)")
        if self.queue_wait_s <= 0:
            raise ValueError("queue_wait_s must be > 0")
        if not 0 < self.deadline_margin <= 1:
            raise ValueError("deadline_margin must be in (0, 1]")
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
    """Sickness: any one sign trips it (and holds it until all have cleared)."""
    off_limit = c.breaker_off_model_clear if active else c.breaker_off_model
    err_limit = c.breaker_error_rate_clear if active else c.breaker_error_rate
    enough = s.requests >= c.breaker_min_requests
    details = {"off_model": s.off_model, "error_rate": s.error_rate,
               "stalled_s": s.stalled_s, "requests": s.requests}
    if s.stalled_s >= c.breaker_stall_s:
        return True, f"no engine step for {s.stalled_s:.1f} s with requests waiting", details
    if enough and s.error_rate > err_limit:
        return True, f"5xx share {s.error_rate:.0%} vs {err_limit:.0%}", details
    if enough and s.off_model is not None and s.off_model > off_limit:
        return True, (f"requests {s.off_model:.1f}x slower than the engine model "
                      f"(vs {off_limit:g}x)"), details
    off = "n/a" if s.off_model is None else f"{s.off_model:.1f}x"
    return False, f"off-model {off} vs {off_limit:g}x, 5xx {s.error_rate:.0%}", details


def breaker_l2(s: Signals, c: PolicyConfig, active: bool):
    """`engine_failed` stays true while the engine is being restarted, so the breaker
    holds exactly as long as the engine is out (no minimum hold: see the table)."""
    return s.engine_failed, "engine failed" if s.engine_failed else "engine healthy", {}


def token_cap(s: Signals, c: PolicyConfig, active: bool):
    limit = c.queue_depth_clear if active else c.queue_depth
    return s.queue_depth > limit, f"queue depth {s.queue_depth} vs {limit}", {
        "queue_depth": s.queue_depth, "threshold": limit, "cap": c.max_tokens_cap}


def deadline_refusing(s: Signals, c: PolicyConfig, active: bool):
    """The deadline check is always applied (unless forced off); the policy reads
    active while it is refusing requests, so the console shows when it acts."""
    return s.deadline_refusals > 0, f"{s.deadline_refusals} refused since the last look", {
        "refused": s.deadline_refusals}


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
        PREDICTED_MISS: (deadline_refusing, c.timing()),
    }
