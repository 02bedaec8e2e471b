"""Memory pressure ahead of time: the KV cache's time to full at its recent trend, as a
signal the memory-pressure policy trips on before vLLM starts preempting, and as the
gauge `tailguard_kv_cache_exhaustion_seconds` (alert: TailguardKVCacheFullSoon)."""

from __future__ import annotations

import pytest

from observe import registry as R
from slo.policy import conditions as P
from slo.policy.engine import KV_TREND_S, PolicyEngine
from slo.policy.lifecycle import ACTIVE, INACTIVE
from slo.policy.live_windows import time_to_full
from tests.prom_samples import fresh_metrics, sample_value

T0 = 1_000_000.0
CONFIG = P.PolicyConfig()


def _line(start: float, per_s: float, seconds: int = 10) -> list[tuple[float, float]]:
    return [(T0 + i, start + per_s * i) for i in range(seconds)]


@pytest.mark.parametrize("points,expected", [
    (_line(0.50, 0.01), (1.0 - 0.59) / 0.01),  # 59% now, +1%/s: 41 s
    (_line(0.20, 0.002, 30), (1.0 - 0.258) / 0.002),  # slow but steady: 371 s
    (_line(0.99, 0.01, 5), 0.0),  # past full already: now
    (_line(0.60, 0.0), None),  # flat
    (_line(0.60, -0.01), None),  # draining
    (_line(0.60, 0.00005), None),  # under 0.01% a second: flat
    (_line(0.50, 0.01, 4), None),  # four seconds tell nothing
    ([(T0, 0.5)] * 6, None),  # one instant: no trend
])
def test_time_to_full_from_the_least_squares_trend(points, expected):
    got = time_to_full(points)
    assert got == (None if expected is None else pytest.approx(expected))


def test_a_spike_is_one_point_of_the_trend_not_the_trend():
    points = _line(0.40, 0.0, 29) + [(T0 + 29, 0.70)]  # flat, then one jump
    slope = 0.30 * (29 - 14.5) / sum((t - 14.5) ** 2 for t in range(30))
    assert time_to_full(points) == pytest.approx((1.0 - 0.70) / slope)


def _signals(usage: float, exhaustion_s: float | None) -> P.Signals:
    return P.Signals(now=T0, p99_s=None, error_rate=0.0, engine_failed=False, queue_depth=0,
                     load=0.0, kv_usage=usage, kv_forecast=None, requests=100,
                     kv_exhaustion_s=exhaustion_s)


@pytest.mark.parametrize("usage,exhaustion_s,active,breached,reason", [
    (0.60, 41.0, False, True, "KV-cache full in 41 s at its trend vs 60 s"),
    (0.60, 60.0, False, False, "KV-cache measured 60% vs 90%"),
    (0.60, None, False, False, "KV-cache measured 60% vs 90%"),
    (0.95, 500.0, False, True, "KV-cache measured 95% vs 90%"),  # high wins the reason
    (0.60, 90.0, True, True, "KV-cache full in 90 s at its trend vs 120 s"),  # holds
    (0.60, 120.0, True, False, "KV-cache measured 60% vs 80%"),  # lets go at 120 s
    (0.40, 10.0, False, False, "KV-cache measured 40% vs 90%"),  # a burst into a cold cache
    (0.50, 10.0, False, True, "KV-cache full in 10 s at its trend vs 60 s"),
])
def test_memory_pressure_trips_on_time_to_full(usage, exhaustion_s, active, breached, reason):
    hit, text, details = P.memory_pressure(_signals(usage, exhaustion_s), CONFIG, active)
    assert (hit, text) == (breached, reason)
    assert details["kv_exhaustion_s"] == exhaustion_s


def test_time_to_full_off_when_set_to_zero():
    off = P.PolicyConfig(memory_exhaustion_s=0.0)
    assert P.memory_pressure(_signals(0.6, 0.0), off, False)[0] is False


def test_the_clear_point_may_not_come_before_the_trip_point():
    with pytest.raises(ValueError, match="memory_exhaustion_clear_s must not be below"):
        P.PolicyConfig(memory_exhaustion_s=120.0, memory_exhaustion_clear_s=60.0)


def test_the_policy_engine_acts_while_usage_is_still_under_the_threshold():
    """KV usage climbing 1% a second from 30%: memory pressure is active at 59%, long
    before the 90% threshold (31 s more at that pace) and before preemption."""
    engine = PolicyEngine(CONFIG, lambda *event: None, lambda *gauge: None)
    for i in range(30):
        engine.on_engine_second(0.5, T0 + i, kv_usage=0.30 + 0.01 * i)
    now = T0 + 29
    signals = engine.signals(now, engine_failed=False, queue_depth=0, kv_usage=0.59,
                             kv_forecast=None)
    assert signals.kv_exhaustion_s == pytest.approx(41.0)
    engine.evaluate(signals)
    assert engine.effective_states()[P.MEMORY_PRESSURE] == ACTIVE


def test_old_samples_leave_the_trend():
    engine = PolicyEngine(CONFIG, lambda *event: None, lambda *gauge: None)
    for i in range(20):  # a climb that ended
        engine.on_engine_second(0.5, T0 + i, kv_usage=0.30 + 0.02 * i)
    later = T0 + 19 + KV_TREND_S + 1
    for i in range(10):
        engine.on_engine_second(0.5, later - 9 + i, kv_usage=0.68)
    signals = engine.signals(later, engine_failed=False, queue_depth=0, kv_usage=0.68,
                             kv_forecast=None)
    assert signals.kv_exhaustion_s is None
    engine.evaluate(signals)
    assert engine.effective_states()[P.MEMORY_PRESSURE] == INACTIVE


def test_the_gauge_says_seconds_and_the_cap_when_not_rising():
    name = R.KV_CACHE_EXHAUSTION.prom_name
    with fresh_metrics() as (metrics, registry):
        metrics.record_kv_exhaustion(41.0)
        assert sample_value(registry, name) == 41.0
        metrics.record_kv_exhaustion(None)
        assert sample_value(registry, name) == 3600.0
        metrics.record_kv_exhaustion(5000.0)
        assert sample_value(registry, name) == 3600.0
