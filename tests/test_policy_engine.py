"""The degradation-policy engine's pure parts, pinned to hand-computed values: the
per-policy state machine (trip delay, min hold, back-off), operator overrides, the
policy conditions with their hysteresis, batch-size control, the decisions admission
reads, and the in-memory windows. No server, no clock: every time is explicit."""

from __future__ import annotations

import pytest

from slo.policy import conditions as P
from slo.policy.batch_size import BatchController, LimitChange
from slo.policy.decisions import Decisions, decide
from slo.policy.engine import PolicyEngine
from slo.policy.lifecycle import (
    ACTIVE,
    AUTO,
    FORCE_OFF,
    FORCE_ON,
    INACTIVE,
    RECOVERING,
    Override,
    PolicyMachine,
    Timing,
    Transition,
)
from slo.policy.live_windows import OutcomeWindow, SampleWindow, quantile

T0 = 1_000_000.0  # epoch seconds; any non-zero start
CONFIG = P.PolicyConfig()


def _run(machine: PolicyMachine, breaches: str, start: float = T0) -> list[tuple]:
    """Step once a second from `start`; `breaches` is one char a tick, '#' breached,
    '.' clear. The transitions as (tick, from, to)."""
    out = []
    for i, mark in enumerate(breaches):
        moved = machine.step(start + i, mark == "#", "cond", {"tick": i})
        if moved is not None:
            out.append((i, moved.from_state, moved.to_state))
    return out


# --- PolicyMachine: trip delay, min hold, recovery ---------------------------------

@pytest.mark.parametrize("trip_after_s,breaches,expected", [
    # trips on the first breached tick when there is no delay
    (0, "#", [(0, INACTIVE, ACTIVE)]),
    (0, ".#", [(1, INACTIVE, ACTIVE)]),
    (0, "....", []),
    # a 3 s delay: breached at ticks 0..3 -> 3 s held at tick 3
    (3, "###", []),
    (3, "####", [(3, INACTIVE, ACTIVE)]),
    (3, "#####", [(3, INACTIVE, ACTIVE)]),
    # an interruption restarts the clock: breached again from tick 3, trips at 6
    (3, "##.####", [(6, INACTIVE, ACTIVE)]),
    (3, "###.###", []),
    (30, "#" * 30, []),
    (30, "#" * 31, [(30, INACTIVE, ACTIVE)]),
])
def test_a_breach_trips_only_once_held_for_trip_after_s(trip_after_s, breaches, expected):
    machine = PolicyMachine("p", Timing(trip_after_s=trip_after_s))
    assert _run(machine, breaches) == expected
    assert machine.state == (ACTIVE if expected else INACTIVE)


def test_a_breach_starting_at_time_zero_trips_on_time():
    machine = PolicyMachine("p", Timing(trip_after_s=3))
    assert _run(machine, "####", start=0.0) == [(3, INACTIVE, ACTIVE)]


@pytest.mark.parametrize("breaches,expected", [
    # active at 0; cleared from tick 1 but held until tick 10 (min_hold_s 10)
    ("#" + "." * 9, [(0, INACTIVE, ACTIVE)]),
    ("#" + "." * 10, [(0, INACTIVE, ACTIVE), (10, ACTIVE, RECOVERING)]),
    # still breached past the hold: it leaves only when it clears (tick 12)
    ("#" * 12 + ".", [(0, INACTIVE, ACTIVE), (12, ACTIVE, RECOVERING)]),
    # recovery waits 5 s: recovering at 10, inactive at 15, not before
    ("#" + "." * 14, [(0, INACTIVE, ACTIVE), (10, ACTIVE, RECOVERING)]),
    ("#" + "." * 15, [(0, INACTIVE, ACTIVE), (10, ACTIVE, RECOVERING),
                      (15, RECOVERING, INACTIVE)]),
    # a relapse during recovery goes straight back to active (no trip delay)
    ("#" + "." * 10 + "#", [(0, INACTIVE, ACTIVE), (10, ACTIVE, RECOVERING),
                            (11, RECOVERING, ACTIVE)]),
])
def test_min_hold_and_the_recovery_wait(breaches, expected):
    machine = PolicyMachine("p", Timing(min_hold_s=10))
    assert _run(machine, breaches) == expected
    assert machine.state == expected[-1][2]


def test_each_transition_carries_policy_states_reason_details_and_time():
    machine = PolicyMachine("breaker_l1", Timing(min_hold_s=10))
    assert machine.step(T0, True, "p99 high", {"p99_s": 2.0}) == Transition(
        "breaker_l1", INACTIVE, ACTIVE, "p99 high", {"p99_s": 2.0}, T0)
    assert (machine.since, machine.reason) == (T0, "p99 high")
    assert machine.step(T0 + 9.5, False, "p99 ok", {}) is None  # held
    assert machine.step(T0 + 10, False, "p99 ok", {"p99_s": 0.3}) == Transition(
        "breaker_l1", ACTIVE, RECOVERING, "condition cleared; recovery check in 5 s",
        {"p99_s": 0.3}, T0 + 10)
    assert machine.recover_at == T0 + 15
    assert machine.step(T0 + 14.9, False, "p99 ok", {}) is None
    assert machine.step(T0 + 15, False, "p99 ok", {"x": 1}) == Transition(
        "breaker_l1", RECOVERING, INACTIVE, "recovered: condition stayed clear", {"x": 1},
        T0 + 15)
    assert (machine.state, machine.since, machine.backoff_s) == (INACTIVE, T0 + 15, 5)
    assert machine.reason == "recovered: condition stayed clear"


def test_a_relapse_says_so_in_the_reason():
    machine = PolicyMachine("p", Timing(min_hold_s=0))
    machine.step(T0, True, "hot", {})
    machine.step(T0 + 1, False, "cool", {})
    assert machine.step(T0 + 2, True, "hot again", {"n": 2}) == Transition(
        "p", RECOVERING, ACTIVE, "relapse: hot again", {"n": 2}, T0 + 2)
    assert machine.backoff_s == 10


@pytest.mark.parametrize("state,breached", [
    (INACTIVE, False), (ACTIVE, True), (RECOVERING, False)])
def test_no_transition_returns_none(state, breached):
    machine = PolicyMachine("p", Timing(min_hold_s=0))
    machine.state, machine.since, machine.recover_at = state, T0, T0 + 5
    assert machine.step(T0 + 1, breached, "r", {}) is None
    assert machine.state == state


@pytest.mark.parametrize("timing,waits", [
    (Timing(min_hold_s=0), [5, 10, 20, 40, 80, 160, 160, 160]),
    (Timing(min_hold_s=0, backoff_max_s=30), [5, 10, 20, 30, 30]),
    (Timing(min_hold_s=0, backoff_s=2, backoff_factor=3, backoff_max_s=50), [2, 6, 18, 50]),
    (Timing(min_hold_s=0, backoff_factor=1), [5, 5, 5]),
])
def test_back_off_grows_on_each_relapse_up_to_the_cap(timing, waits):
    machine = PolicyMachine("p", timing)
    now = T0
    machine.step(now, True, "r", {})
    seen = []
    for _ in waits:
        now += 1
        moved = machine.step(now, False, "r", {})  # clear -> recovering
        assert moved.to_state == RECOVERING
        seen.append(machine.recover_at - now)
        now += 1
        assert machine.step(now, True, "r", {}).to_state == ACTIVE  # relapse
    assert seen == waits


def test_a_clean_recovery_resets_the_back_off():
    machine = PolicyMachine("p", Timing(min_hold_s=0))
    # trip, then three relapses: the wait is 5, 10, 20, now 40
    assert _run(machine, "#.#.#.#") == [
        (0, INACTIVE, ACTIVE), (1, ACTIVE, RECOVERING), (2, RECOVERING, ACTIVE),
        (3, ACTIVE, RECOVERING), (4, RECOVERING, ACTIVE), (5, ACTIVE, RECOVERING),
        (6, RECOVERING, ACTIVE)]
    assert machine.backoff_s == 40
    now = T0 + 7
    machine.step(now, False, "r", {})
    assert machine.recover_at == now + 40
    assert machine.step(now + 39, False, "r", {}) is None
    assert machine.step(now + 40, False, "r", {}).to_state == INACTIVE
    assert machine.backoff_s == 5
    # the next episode starts from 5 s again
    now += 41
    machine.step(now, True, "r", {})
    machine.step(now + 1, False, "r", {})
    assert machine.recover_at == now + 1 + 5


# --- Timing and overrides ----------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"trip_after_s": -1}, {"min_hold_s": -0.1}, {"backoff_s": 0}, {"backoff_s": -5},
    {"backoff_factor": 0.9}, {"backoff_max_s": 4.9}, {"backoff_s": 200}])
def test_bad_timings_are_refused(kwargs):
    with pytest.raises(ValueError):
        Timing(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {}, {"trip_after_s": 0, "min_hold_s": 0}, {"backoff_factor": 1},
    {"backoff_s": 160, "backoff_max_s": 160}])
def test_edge_timings_are_accepted(kwargs):
    Timing(**kwargs)


def _override(mode: str = FORCE_ON, expires: float | None = None, reason: str = "drill"):
    return Override(mode=mode, reason=reason, actor="ops", created=T0, expires=expires)


@pytest.mark.parametrize("state,mode,effective", [
    (INACTIVE, None, INACTIVE), (ACTIVE, None, ACTIVE), (RECOVERING, None, RECOVERING),
    (INACTIVE, AUTO, INACTIVE), (ACTIVE, AUTO, ACTIVE), (RECOVERING, AUTO, RECOVERING),
    (INACTIVE, FORCE_ON, ACTIVE), (RECOVERING, FORCE_ON, ACTIVE), (ACTIVE, FORCE_ON, ACTIVE),
    (ACTIVE, FORCE_OFF, INACTIVE), (RECOVERING, FORCE_OFF, INACTIVE),
    (INACTIVE, FORCE_OFF, INACTIVE)])
def test_effective_state_follows_the_override(state, mode, effective):
    machine = PolicyMachine("p")
    machine.state = state
    machine.override = None if mode is None else _override(mode)
    assert machine.effective == effective
    assert machine.state == state  # the machine itself is untouched


def test_the_machine_keeps_running_under_an_override():
    machine = PolicyMachine("p", Timing(min_hold_s=0))
    machine.override = _override(FORCE_OFF, expires=T0 + 10)
    assert machine.step(T0, True, "hot", {}).to_state == ACTIVE
    assert (machine.state, machine.effective) == (ACTIVE, INACTIVE)
    assert machine.expire_override(T0 + 9) is None
    assert machine.effective == INACTIVE
    gone = machine.expire_override(T0 + 10)
    assert gone.mode == FORCE_OFF
    assert (machine.override, machine.effective) == (None, ACTIVE)


@pytest.mark.parametrize("expires,now,dropped", [
    (None, T0 + 1e9, False), (T0 + 100, T0 + 99.9, False), (T0 + 100, T0 + 100, True),
    (T0 + 100, T0 + 500, True)])
def test_expire_override_drops_only_expired_ones(expires, now, dropped):
    machine = PolicyMachine("p")
    override = _override(FORCE_ON, expires=expires)
    machine.override = override
    assert override.expired(now) is dropped
    result = machine.expire_override(now)
    if dropped:
        assert result is override and machine.override is None
        assert machine.expire_override(now) is None  # nothing left to drop
    else:
        assert result is None and machine.override is override


def test_expire_override_without_one_is_none():
    assert PolicyMachine("p").expire_override(T0) is None


@pytest.mark.parametrize("mode,reason,message", [
    ("on", "drill", "mode must be one of"), ("FORCE_ON", "drill", "mode must be one of"),
    ("", "drill", "mode must be one of"), (FORCE_ON, "", "needs a reason"),
    (FORCE_OFF, "   ", "needs a reason"), (AUTO, "\n\t", "needs a reason")])
def test_bad_overrides_are_refused(mode, reason, message):
    with pytest.raises(ValueError, match=message):
        _override(mode, reason=reason)


# --- conditions --------------------------------------------------------------------

def _signals(**kw) -> P.Signals:
    base = dict(now=T0, p99_s=None, error_rate=0.0, engine_failed=False,
                queue_depth=0, load=0.0, kv_usage=0.0, kv_forecast=None, requests=100)
    base.update(kw)
    return P.Signals(**base)


@pytest.mark.parametrize("signals,active,breached,reason", [
    # far off the engine model: trips above 3x, holds down to 1.5x
    ({"off_model": 3.5}, False, True, "requests 3.5x slower than the engine model (vs 3x)"),
    ({"off_model": 3.0}, False, False, "off-model 3.0x vs 3x, 5xx 0%"),
    ({"off_model": 2.0}, True, True, "requests 2.0x slower than the engine model (vs 1.5x)"),
    ({"off_model": 1.5}, True, False, "off-model 1.5x vs 1.5x, 5xx 0%"),
    ({"off_model": None}, False, False, "off-model n/a vs 3x, 5xx 0%"),
    # 5xx errors: above half trips, a fifth or less clears
    ({"error_rate": 0.6}, False, True, "5xx share 60% vs 50%"),
    ({"error_rate": 0.5}, False, False, "off-model n/a vs 3x, 5xx 50%"),
    ({"error_rate": 0.3}, True, True, "5xx share 30% vs 20%"),
    # too few requests say nothing of either
    ({"off_model": 9.0, "error_rate": 1.0, "requests": 9}, False, False,
     "off-model 9.0x vs 3x, 5xx 100%"),
    # a stall needs no request to finish: the engine took no step for 5 s with work
    ({"stalled_s": 5.0, "requests": 0}, False, True,
     "no engine step for 5.0 s with requests waiting"),
    ({"stalled_s": 4.9}, False, False, "off-model n/a vs 3x, 5xx 0%"),
    # load alone (a deep queue, a hot engine, a high P99) is not sickness
    ({"p99_s": 30.0, "load": 1.0, "queue_depth": 500, "off_model": 1.2}, False, False,
     "off-model 1.2x vs 3x, 5xx 0%")])
def test_breaker_l1_trips_on_sickness_not_load(signals, active, breached, reason):
    hit, text, details = P.breaker_l1(_signals(**signals), CONFIG, active)
    assert (hit, text) == (breached, reason)
    s = _signals(**signals)
    assert details == {"off_model": s.off_model, "error_rate": s.error_rate,
                       "stalled_s": s.stalled_s, "requests": s.requests}


def test_breaker_l1_minimum_requests_is_configurable():
    config = P.PolicyConfig(breaker_min_requests=3)
    assert P.breaker_l1(_signals(off_model=4.0, requests=3), config, False)[0] is True
    assert P.breaker_l1(_signals(off_model=4.0, requests=2), config, False)[0] is False


@pytest.mark.parametrize("refusals,breached", [(0, False), (1, True), (40, True)])
def test_the_deadline_policy_reads_active_while_it_refuses(refusals, breached):
    hit, reason, details = P.deadline_refusing(_signals(deadline_refusals=refusals), CONFIG,
                                               False)
    assert (hit, reason, details) == (breached, f"{refusals} refused since the last look",
                                      {"refused": refusals})


@pytest.mark.parametrize("failed,active,breached,reason", [
    (True, False, True, "engine failed"), (True, True, True, "engine failed"),
    (False, False, False, "engine healthy"), (False, True, False, "engine healthy")])
def test_breaker_l2_follows_engine_failure(failed, active, breached, reason):
    assert P.breaker_l2(_signals(engine_failed=failed), CONFIG, active) == (breached, reason, {})


@pytest.mark.parametrize("depth,active,breached,threshold", [
    (0, False, False, 5), (5, False, False, 5), (6, False, True, 5), (50, False, True, 5),
    (5, True, True, 2), (3, True, True, 2), (2, True, False, 2), (0, True, False, 2)])
def test_token_cap_trips_above_5_and_holds_down_to_2(depth, active, breached, threshold):
    hit, reason, details = P.token_cap(_signals(queue_depth=depth), CONFIG, active)
    assert hit is breached
    assert reason == f"queue depth {depth} vs {threshold}"
    assert details == {"queue_depth": depth, "threshold": threshold, "cap": 256}


@pytest.mark.parametrize("load,active,breached,reason", [
    (0.8, False, False, "load 80% vs 80%"), (0.81, False, True, "load 81% vs 80%"),
    (0.75, False, False, "load 75% vs 80%"), (0.75, True, True, "load 75% vs 70%"),
    (0.7, True, False, "load 70% vs 70%"), (0.2, True, False, "load 20% vs 70%"),
    (1.0, False, True, "load 100% vs 80%")])
def test_overloaded_trips_above_0_8_and_holds_down_to_0_7(load, active, breached, reason):
    hit, text, details = P.overloaded(_signals(load=load), CONFIG, active)
    assert (hit, text) == (breached, reason)
    assert details == {"load": load, "threshold": 0.7 if active else 0.8}


@pytest.mark.parametrize("usage,forecast,active,breached,reason", [
    (0.5, None, False, False, "KV-cache measured 50% vs 90%"),
    (0.95, None, False, True, "KV-cache measured 95% vs 90%"),
    (0.9, None, False, False, "KV-cache measured 90% vs 90%"),
    (0.5, 0.95, False, True, "KV-cache forecast 95% vs 90%"),
    (0.95, 0.5, False, True, "KV-cache measured 95% vs 90%"),
    (0.92, 0.97, False, True, "KV-cache forecast 97% vs 90%"),
    (0.5, 0.9, False, False, "KV-cache forecast 90% vs 90%"),
    (0.85, None, True, True, "KV-cache measured 85% vs 80%"),
    (0.3, 0.85, True, True, "KV-cache forecast 85% vs 80%"),
    (0.8, 0.7, True, False, "KV-cache measured 80% vs 80%"),
    (0.6, 0.0, True, False, "KV-cache measured 60% vs 80%")])
def test_memory_pressure_on_measured_or_forecast(usage, forecast, active, breached, reason):
    hit, text, details = P.memory_pressure(_signals(kv_usage=usage, kv_forecast=forecast),
                                           CONFIG, active)
    assert (hit, text) == (breached, reason)
    assert details == {"kv_usage": usage, "kv_forecast": forecast,
                       "threshold": 0.8 if active else 0.9, "kv_exhaustion_s": None}


@pytest.mark.parametrize("kwargs,message", [
    ({"breaker_off_model_clear": 3.1}, "breaker_off_model_clear must not exceed"),
    ({"breaker_off_model": 1.4}, "breaker_off_model_clear must not exceed"),
    ({"breaker_error_rate_clear": 0.6}, "breaker_error_rate_clear must not exceed"),
    ({"deadline_margin": 0}, "deadline_margin must be in"),
    ({"deadline_margin": 1.2}, "deadline_margin must be in"),
    ({"deadline_check": "no"}, "deadline_check must be true or false"),
    ({"load_clear": 0.81}, "load_clear must not exceed"),
    ({"memory_clear": 0.91}, "memory_clear must not exceed"),
    ({"queue_depth_clear": 6}, "queue_depth_clear must not exceed"),
    ({"breaker_for_s": -1}, "breaker_for_s must be >= 0"),
    ({"batch_cap": -1}, "batch_cap must be >= 0"),
    ({"min_hold_s": -0.1}, "min_hold_s must be >= 0"),
    ({"memory_clear": -0.1}, "memory_clear must be >= 0"),
    ({"batch_floor": 0}, "batch_floor must be between"),
    ({"batch_floor": 65}, "batch_floor must be between"),
    ({"batch_initial": 4}, "batch_initial must be between"),
    ({"batch_initial": 65}, "batch_initial must be between")])
def test_bad_policy_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        P.PolicyConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {}, {"load_clear": 0.8}, {"breaker_off_model_clear": 3.0}, {"deadline_margin": 1.0}, {"queue_depth_clear": 5},
    {"batch_floor": 64, "batch_initial": 64}, {"batch_floor": 1}])
def test_edge_policy_configs_are_accepted(kwargs):
    P.PolicyConfig(**kwargs)


@pytest.mark.parametrize("name,condition,trip_after_s,min_hold_s", [
    (P.BREAKER_L1, P.breaker_l1, 10, 10), (P.BREAKER_L2, P.breaker_l2, 0, 0),
    (P.TOKEN_CAP, P.token_cap, 0, 10), (P.VIP_ONLY, P.overloaded, 120, 10),
    (P.MEMORY_PRESSURE, P.memory_pressure, 0, 10), (P.TRUNCATION, P.overloaded, 0, 10),
    (P.PREDICTED_MISS, P.deadline_refusing, 0, 10)])
def test_policy_table_conditions_and_timings(name, condition, trip_after_s, min_hold_s):
    """Breaker L2 has no minimum hold: its condition covers the restart, so it lets go
    as soon as the restarted engine is warm."""
    found, timing = P.policy_table(CONFIG)[name]
    assert found is condition
    assert timing == Timing(trip_after_s=trip_after_s, min_hold_s=min_hold_s, backoff_s=5)


def test_breaker_l2_holds_through_the_restart_and_lets_go_at_the_first_healthy_check():
    _, timing = P.policy_table(CONFIG)[P.BREAKER_L2]
    l2 = PolicyMachine(P.BREAKER_L2, timing)
    assert l2.step(T0, True, "engine failed", {}).to_state == ACTIVE
    assert l2.step(T0 + 12, True, "engine failed", {}) is None  # still restarting
    assert l2.step(T0 + 12.1, False, "engine healthy", {}).to_state == RECOVERING


def test_policy_table_has_the_seven_policies_and_follows_the_config():
    table = P.policy_table(CONFIG)
    assert list(table) == [P.BREAKER_L1, P.BREAKER_L2, P.TOKEN_CAP, P.VIP_ONLY,
                           P.MEMORY_PRESSURE, P.TRUNCATION, P.PREDICTED_MISS]
    assert P.BATCH_CONTROL not in table
    custom = P.policy_table(P.PolicyConfig(breaker_for_s=12, vip_only_for_s=60,
                                           min_hold_s=3, backoff_s=2))
    assert custom[P.BREAKER_L1][1] == Timing(trip_after_s=12, min_hold_s=3, backoff_s=2)
    assert custom[P.VIP_ONLY][1] == Timing(trip_after_s=60, min_hold_s=3, backoff_s=2)


# --- batch control -----------------------------------------------------------------

BAD, SLOW_IDLE, GOOD, IDLE = (0.6, 0.9), (0.6, 0.1), (0.3, 0.9), (0.3, 0.3)


def _windows(controller: BatchController, windows: list[tuple]) -> list:
    """Open a window at T0, then close one every 5 s; each close's (old, new) or None."""
    assert controller.step(T0, None, 0.0) is None  # the first call only opens a window
    out = []
    for i, (p99_s, utilisation) in enumerate(windows, start=1):
        change = controller.step(T0 + 5 * i, p99_s, utilisation)
        out.append(None if change is None else (change.old, change.new))
    return out


@pytest.mark.parametrize("windows,expected,limit", [
    ([BAD, BAD], [None, None], 64),
    ([BAD, BAD, BAD], [None, None, (64, 51)], 51),
    # a good window in between resets the count
    ([BAD, BAD, GOOD, BAD, BAD], [None] * 5, 64),
    ([BAD, BAD, GOOD, BAD, BAD, BAD], [None] * 5 + [(64, 51)], 51),
    # after a cut, three more windows for the next one
    ([BAD] * 6, [None, None, (64, 51), None, None, (51, 40)], 40),
    # a breach window never raises, even when the engine is idle
    ([SLOW_IDLE, SLOW_IDLE, SLOW_IDLE], [None, None, (64, 51)], 51),
    # P99 exactly at 0.5 s and an unknown P99 are not breaches
    ([(0.5, 0.9)] * 3, [None] * 3, 64),
    ([(None, 0.9)] * 3, [None] * 3, 64),
    # at the cap, low utilisation has nowhere to go
    ([IDLE, IDLE], [None, None], 64),
    ([BAD, BAD, BAD, IDLE, IDLE], [None, None, (64, 51), (51, 62), (62, 64)], 64),
    # utilisation exactly 60% is not low
    ([BAD, BAD, BAD, (0.3, 0.6)], [None, None, (64, 51), None], 51),
    ([BAD, BAD, BAD, (None, 0.59)], [None, None, (64, 51), (51, 62)], 62),
])
def test_batch_windows(windows, expected, limit):
    controller = BatchController(CONFIG, limit=64)
    assert _windows(controller, windows) == expected
    assert controller.limit == limit


def test_repeated_cuts_stop_at_the_floor():
    controller = BatchController(CONFIG, limit=64)
    changes = [c for c in _windows(controller, [BAD] * 33) if c is not None]
    assert changes == [(64, 51), (51, 40), (40, 32), (32, 25), (25, 20), (20, 16), (16, 12),
                       (12, 9), (9, 8)]
    assert controller.limit == 8


def test_raises_round_up_and_stop_at_the_cap():
    controller = BatchController(CONFIG, limit=8)
    changes = _windows(controller, [IDLE] * 13)
    assert changes == [(8, 10), (10, 12), (12, 15), (15, 18), (18, 22), (22, 27), (27, 33),
                       (33, 40), (40, 48), (48, 58), (58, 64), None, None]


def test_calls_inside_a_window_are_ignored():
    controller = BatchController(CONFIG, limit=64)
    assert controller.step(T0, None, 0.0) is None
    for t in (T0 + 1, T0 + 2, T0 + 4.99):
        assert controller.step(t, 9.0, 0.9) is None
    assert controller.breaches == 0
    assert controller.step(T0 + 5, 0.6, 0.9) is None
    assert (controller.breaches, controller.window_end) == (1, T0 + 10)
    # a late evaluation starts the next window from when it ran
    assert controller.step(T0 + 13, 0.6, 0.9) is None
    assert (controller.breaches, controller.window_end) == (2, T0 + 18)
    assert controller.step(T0 + 17, 0.6, 0.9) is None
    assert controller.step(T0 + 18, 0.6, 0.9) is not None


def test_limit_changes_carry_reason_and_details():
    controller = BatchController(CONFIG, limit=64)
    controller.step(T0, None, 0.0)
    controller.step(T0 + 5, 0.7, 0.9)
    controller.step(T0 + 10, 0.8, 0.9)
    assert controller.step(T0 + 15, 0.612, 0.95) == LimitChange(
        64, 51, "TTFT P99 0.612 s > 0.5 s for 3 windows",
        {"p99_s": 0.612, "utilisation": 0.95, "breaches": 3})
    assert controller.breaches == 0
    assert controller.step(T0 + 20, 0.2, 0.25) == LimitChange(
        51, 62, "utilisation 25% < 60%", {"p99_s": 0.2, "utilisation": 0.25, "breaches": 0})


@pytest.mark.parametrize("limit,expected", [(0, 16), (20, 20), (8, 8)])
def test_initial_limit(limit, expected):
    """Starts at batch_initial (16), not the cap: a surge must not meet a limit that an
    idle period inflated."""
    assert BatchController(CONFIG, limit=limit).limit == expected


def test_lifting_a_force_off_starts_batch_control_over():
    """force_off holds the limit at the cap; lifted, control starts at batch_initial as
    on a new server, not at the cap it would take a minute of cuts to leave."""
    events = []
    engine = PolicyEngine(CONFIG, lambda *event: events.append(event), lambda *gauge: None)

    def limit_at(now: float) -> int:
        signals = engine.signals(now, engine_failed=False, queue_depth=0, kv_usage=0.0,
                                 kv_forecast=None)
        return engine.evaluate(signals).concurrency_limit

    assert limit_at(T0) == 16
    engine.machines[P.BATCH_CONTROL].override = _override(FORCE_OFF)
    assert (limit_at(T0 + 1), limit_at(T0 + 2)) == (64, 64)
    assert events == []
    engine.machines[P.BATCH_CONTROL].override = None
    assert (limit_at(T0 + 3), limit_at(T0 + 4)) == (16, 16)
    assert events == [(P.BATCH_CONTROL, "limit=64", "limit=16",
                       "override lifted: control starts over", {})]


# --- decisions ---------------------------------------------------------------------

def _on(limit: int, **kw) -> Decisions:
    """Decisions with the deadline check in force (it is unless forced off)."""
    return Decisions(limit, **{"deadline_margin": 1.0, "deadline_truncate_tokens": 4096,
                               "prefill_gate_steps": 1.0, "keep_promises": True, **kw})


@pytest.mark.parametrize("states,batch_limit,expected", [
    ({}, 64, _on(64)),
    ({name: INACTIVE for name in P.policy_table(CONFIG)}, 64, _on(64)),
    ({P.BREAKER_L1: ACTIVE}, 64, _on(1, probing=True)),
    ({P.BREAKER_L1: RECOVERING}, 64, _on(32, recovering=True)),
    ({P.BREAKER_L1: RECOVERING}, 51, _on(25, recovering=True)),
    ({P.BREAKER_L1: RECOVERING}, 1, _on(1, recovering=True)),
    ({P.VIP_ONLY: ACTIVE}, 64, _on(64, shed_non_vip=P.VIP_ONLY)),
    ({P.VIP_ONLY: RECOVERING}, 64, _on(64)),
    ({P.BREAKER_L1: ACTIVE, P.VIP_ONLY: ACTIVE}, 64,
     _on(1, probing=True, shed_non_vip=P.VIP_ONLY)),
    ({P.BREAKER_L1: RECOVERING, P.VIP_ONLY: ACTIVE}, 64,
     _on(32, shed_non_vip=P.VIP_ONLY, recovering=True)),
    ({P.MEMORY_PRESSURE: ACTIVE}, 64, _on(32, memory_pressure=True)),
    ({P.MEMORY_PRESSURE: ACTIVE}, 51, _on(25, memory_pressure=True)),
    ({P.MEMORY_PRESSURE: ACTIVE}, 1, _on(1, memory_pressure=True)),
    ({P.MEMORY_PRESSURE: RECOVERING}, 64, _on(64)),
    ({P.MEMORY_PRESSURE: ACTIVE, P.BREAKER_L1: RECOVERING}, 64, _on(16, memory_pressure=True, recovering=True)),
    ({P.MEMORY_PRESSURE: ACTIVE, P.BREAKER_L1: ACTIVE}, 64,
     _on(1, probing=True, memory_pressure=True)),
    ({P.TOKEN_CAP: ACTIVE}, 64, _on(64, max_tokens_cap=256)),
    ({P.TOKEN_CAP: RECOVERING}, 64, _on(64)),
    ({P.TRUNCATION: ACTIVE}, 64, _on(64, truncate_tokens=4096)),
    ({P.PREDICTED_MISS: ACTIVE}, 64, _on(64, refusing_late=True)),
    ({P.BREAKER_L2: ACTIVE}, 64, _on(64, restarting=True)),
    ({P.BREAKER_L2: RECOVERING}, 64, _on(64)),
    ({name: ACTIVE for name in P.policy_table(CONFIG)}, 64,
     _on(1, probing=True, shed_non_vip=P.VIP_ONLY, restarting=True, max_tokens_cap=256,
               truncate_tokens=4096, refusing_late=True, memory_pressure=True)),
])
def test_decide(states, batch_limit, expected):
    assert decide(states, batch_limit, CONFIG) == expected


@pytest.mark.parametrize("states,active", [
    ({}, ()),
    ({P.BREAKER_L1: ACTIVE}, (P.BREAKER_L1,)),
    ({P.BREAKER_L1: RECOVERING}, (P.BREAKER_L1,)),
    ({P.MEMORY_PRESSURE: ACTIVE}, (P.MEMORY_PRESSURE,)),
    ({P.VIP_ONLY: ACTIVE}, (P.VIP_ONLY,)),
    ({P.BREAKER_L1: ACTIVE, P.VIP_ONLY: ACTIVE}, (P.BREAKER_L1, P.VIP_ONLY)),
    ({P.BREAKER_L2: ACTIVE}, (P.BREAKER_L2,)),
    ({P.TOKEN_CAP: ACTIVE, P.TRUNCATION: ACTIVE}, (P.TOKEN_CAP, P.TRUNCATION)),
    ({P.PREDICTED_MISS: ACTIVE}, (P.PREDICTED_MISS,)),
    ({name: ACTIVE for name in P.policy_table(CONFIG)},
     (P.BREAKER_L2, P.BREAKER_L1, P.VIP_ONLY, P.MEMORY_PRESSURE, P.TOKEN_CAP,
      P.TRUNCATION, P.PREDICTED_MISS))])
def test_active_names_what_is_in_force(states, active):
    assert decide(states, 64, CONFIG).active == active


@pytest.mark.parametrize("config,states,expected", [
    (P.PolicyConfig(max_tokens_cap=128), {P.TOKEN_CAP: ACTIVE}, _on(64, max_tokens_cap=128)),
    (P.PolicyConfig(truncate_tokens=1000), {P.TRUNCATION: ACTIVE},
     _on(64, truncate_tokens=1000, deadline_truncate_tokens=1000)),
    (P.PolicyConfig(memory_concurrency_factor=0.25), {P.MEMORY_PRESSURE: ACTIVE},
     _on(16, memory_pressure=True)),
    (P.PolicyConfig(deadline_margin=0.6), {P.PREDICTED_MISS: ACTIVE},
     _on(64, refusing_late=True, deadline_margin=0.6)),
    (P.PolicyConfig(deadline_check=False), {},
     _on(64, deadline_margin=None, prefill_gate_steps=None, vip_kv_reserve=None,
         keep_promises=False)),
    (P.PolicyConfig(keep_promises=False), {}, _on(64, keep_promises=False)),
    (P.PolicyConfig(vip_kv_reserve_tokens=0), {}, _on(64, vip_kv_reserve=None)),
    (P.PolicyConfig(vip_kv_reserve_tokens=300), {}, _on(64, vip_kv_reserve=300)),
    (P.PolicyConfig(vip_kv_reserve_tokens=300, deadline_check=False), {},
     _on(64, deadline_margin=None, prefill_gate_steps=None, keep_promises=False)),
    (P.PolicyConfig(memory_vip_kv_reserve_tokens=2048, memory_concurrency_factor=1.0),
     {P.MEMORY_PRESSURE: ACTIVE}, _on(64, memory_pressure=True, vip_kv_reserve=2048)),
    (P.PolicyConfig(memory_vip_kv_reserve_tokens=2048), {}, _on(64, vip_kv_reserve=None)),
    (P.PolicyConfig(memory_vip_kv_reserve_tokens=1024, vip_kv_reserve_tokens=300),
     {P.MEMORY_PRESSURE: ACTIVE}, _on(32, memory_pressure=True, vip_kv_reserve=1024)),
    (P.PolicyConfig(memory_vip_kv_reserve_tokens=100, vip_kv_reserve_tokens=300),
     {P.MEMORY_PRESSURE: ACTIVE}, _on(32, memory_pressure=True, vip_kv_reserve=300)),
    (P.PolicyConfig(memory_vip_kv_reserve_tokens=2048, deadline_check=False),
     {P.MEMORY_PRESSURE: ACTIVE},
     _on(32, memory_pressure=True, deadline_margin=None, prefill_gate_steps=None,
         keep_promises=False)),
    (P.PolicyConfig(prefill_gate_steps=2.5), {}, _on(64, prefill_gate_steps=2.5)),
    (P.PolicyConfig(prefill_gate_steps=0), {}, _on(64, prefill_gate_steps=None)),
    (P.PolicyConfig(hold_retries=True), {}, _on(64, hold_retries=True)),
    (P.PolicyConfig(hold_retries=True, deadline_check=False), {},
     _on(64, deadline_margin=None, prefill_gate_steps=None, vip_kv_reserve=None,
         keep_promises=False))])
def test_decide_follows_the_config(config, states, expected):
    assert decide(states, 64, config) == expected


def test_forcing_the_deadline_policy_off_opens_the_prefill_gate_too():
    """The gate orders what the deadline check admits: off together (today's plain
    first-come engine queue), as the surge benchmark's policies-off side runs."""
    off = decide({}, 64, CONFIG, forced_off=frozenset({P.PREDICTED_MISS}))
    assert (off.deadline_margin, off.prefill_gate_steps, off.vip_kv_reserve,
            off.keep_promises) == (None, None, None, False)


@pytest.mark.parametrize("retry_after_s,expected", [
    (5.0, 5), (0.2, 1), (0, 1), (7.6, 8), (10, 10)])
def test_retry_after_is_a_whole_second_at_least_one(retry_after_s, expected):
    assert decide({}, 64, CONFIG, retry_after_s).retry_after_s == expected


def test_decide_defaults_retry_after_to_5_s():
    assert decide({}, 64, CONFIG).retry_after_s == 5


# --- live windows ------------------------------------------------------------------

def _sample_window() -> SampleWindow:
    window = SampleWindow(10.0)
    for t, v in ((100, 1.0), (104, 2.0), (108, 3.0), (110, 4.0)):
        window.add(t, v)
    return window


@pytest.mark.parametrize("now,span_s,expected", [
    (110, None, [1.0, 2.0, 3.0, 4.0]),  # edge 100: a sample exactly at the edge stays
    (110.5, None, [2.0, 3.0, 4.0]),
    (114, None, [2.0, 3.0, 4.0]),
    (114.01, None, [3.0, 4.0]),
    (120, None, [4.0]),
    (120.01, None, []),
    (110, 2, [3.0, 4.0]),  # sub-window: the last 2 s only
    (110, 1.9, [4.0]),
    (110, 0, [4.0]),
    (110, 10, [1.0, 2.0, 3.0, 4.0]),
    (110, 60, [1.0, 2.0, 3.0, 4.0]),  # never more than the window holds
    (112, 8, [2.0, 3.0, 4.0]), (112, 6, [3.0, 4.0])])
def test_sample_window_values(now, span_s, expected):
    assert _sample_window().values(now, span_s) == expected


@pytest.mark.parametrize("now,count,total", [
    (110, 4, 10.0), (110.5, 3, 9.0), (118.5, 1, 4.0), (121, 0, 0.0)])
def test_sample_window_count_and_total(now, count, total):
    window = _sample_window()
    assert window.count(now) == count
    assert window.total(now) == total


def test_sample_window_trim_is_permanent():
    window = _sample_window()
    assert window.values(118) == [3.0, 4.0]
    assert window.values(110) == [3.0, 4.0]  # old samples are gone for good
    window.add(119, 5.0)
    assert window.values(119) == [4.0, 5.0]


ONE_TO_100 = [float(i) for i in range(1, 101)]


@pytest.mark.parametrize("values,q,expected", [
    (ONE_TO_100, 0.99, 99.0), (ONE_TO_100, 0.5, 50.0), (ONE_TO_100, 0.9, 90.0),
    (ONE_TO_100, 0.95, 95.0), (ONE_TO_100, 0.991, 100.0), (ONE_TO_100, 1.0, 100.0),
    (ONE_TO_100, 0.0, 1.0), (ONE_TO_100, 0.001, 1.0), (ONE_TO_100, 0.011, 2.0),
    (list(reversed(ONE_TO_100)), 0.99, 99.0),
    ([float(i) for i in range(1, 11)], 0.99, 10.0),
    ([float(i) for i in range(1, 11)], 0.9, 9.0),
    ([float(i) for i in range(1, 11)], 0.5, 5.0),
    ([float(i) for i in range(1, 1001)], 0.99, 990.0),
    ([float(i) for i in range(1, 1001)], 0.999, 999.0),
    ([7.5], 0.99, 7.5), ([7.5], 0.0, 7.5), ([7.5], 1.0, 7.5),
    ([3.0, 1.0, 2.0], 0.5, 2.0), ([3.0, 1.0, 2.0], 0.34, 2.0), ([3.0, 1.0, 2.0], 0.33, 1.0),
    ([0.2, 0.2, 5.0], 0.99, 5.0),
    ([], 0.99, None), ([], 0.5, None)])
def test_quantile_nearest_rank(values, q, expected):
    before = list(values)
    assert quantile(values, q) == expected
    assert values == before  # the caller's list is not reordered


@pytest.mark.parametrize("q,expected", [(0.07, 7.0), (0.55, 55.0)])
def test_quantile_nearest_rank_has_no_float_off_by_one(q, expected):
    assert quantile(ONE_TO_100, q) == expected


@pytest.mark.parametrize("outcomes,now,rate,count", [
    ([], 100, 0.0, 0),
    ([(100, True), (101, False), (102, False), (103, True)], 103, 0.5, 4),
    ([(100, True), (101, False), (102, False), (103, True)], 130, 0.5, 4),  # edge 100 kept
    ([(100, True), (101, False), (102, False), (103, True)], 130.5, 1 / 3, 3),
    ([(100, True), (101, False), (102, False), (103, True)], 132, 0.5, 2),
    ([(100, True), (101, False), (102, False), (103, True)], 134, 0.0, 0),
    ([(100, False)] * 3, 100, 0.0, 3),
    ([(100, True)] * 3, 100, 1.0, 3)])
def test_outcome_window_error_rate(outcomes, now, rate, count):
    window = OutcomeWindow(30.0)
    for t, error in outcomes:
        window.add(t, error)
    assert window.error_rate(now) == pytest.approx(rate)
    assert window.count(now) == count


def test_an_unsaturated_limit_is_not_raised():
    """Low utilisation alone raises nothing: only when requests waited for a slot
    at some point in the window."""
    controller = BatchController(CONFIG)
    controller.step(T0, None, 0.1, saturated=False)
    assert controller.step(T0 + 5, None, 0.1, saturated=False) is None
    controller.step(T0 + 6, None, 0.1, saturated=True)  # one wait inside the window
    change = controller.step(T0 + 10, None, 0.1, saturated=False)
    assert (change.old, change.new) == (16, 20)
