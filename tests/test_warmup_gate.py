"""The engine's warm-up kept out of the live windows (serving/engine/warmup.py,
`WarmupGate`): a warm-up runs every prompt length back to back, so counted as load it
reads as a 100%-busy engine and trips policies at start-up. Unit cases here; the
session server's own warm-up is checked in `test_warm_up_steps_are_marked_not_live`."""

from __future__ import annotations

from observe import registry as R
from observe.stats import StepRecord
from serving.engine.stats import EngineSecond
from serving.engine.warmup import WarmupGate


def step(start: float, duration: float = 0.4) -> StepRecord:
    return StepRecord(1, start, duration, 0.001, 2048, ("warmup-1",))


def test_steps_before_the_engine_went_live_reach_only_the_consumers_that_want_them():
    second = EngineSecond()
    resets = []
    gate = WarmupGate(on_live=lambda: resets.append(second.take()))
    live, every = gate.live_only(second.on_step), []
    for start in (10.0, 11.0):  # the warm-up: before went_live
        live(step(start))
        every.append(start)
    second.on_iteration(2048, 2, 0, 1)  # vLLM's stat logger saw the warm-up too
    gate.went_live(now=12.0)
    # the warm-up's steps never reached the second; vLLM's count of it is dropped here
    assert len(resets) == 1 and resets[0].prompt_tokens == 2048
    live(step(11.5))  # a warm-up step published late: still warm-up
    live(step(12.5, 0.01))
    snap = second.take()
    assert (snap.steps, snap.prompt_tokens) == (1, 0)  # the live step alone
    assert gate.is_warmup(step(11.9)) and not gate.is_warmup(step(12.0))


def test_a_restart_warms_up_out_of_the_live_windows_again():
    gate = WarmupGate()
    assert gate.is_warmup(step(1e9))  # nothing is live before the first warm-up ends
    gate.went_live(now=5.0)
    gate.warming()  # breaker L2 restarts the engine
    assert gate.is_warmup(step(6.0))
    gate.went_live(now=7.0)
    assert not gate.is_warmup(step(7.5))


def test_the_span_consumer_is_told_which_steps_were_warm_up():
    gate, seen = WarmupGate(), []
    mark = gate.marking(lambda s, warmup: seen.append((s.start, warmup)))
    mark(step(1.0))
    gate.went_live(now=2.0)
    mark(step(3.0))
    assert seen == [(1.0, True), (3.0, False)]


def test_warm_up_steps_are_marked_not_live(server):
    """The session server warmed up before it said ready: its warm-up steps are in the
    trace log, marked, and every one began before the first request arrived."""
    rows = server.sql(
        f"SELECT count(*) AS n, max(start_ts) AS last FROM spans WHERE name = '{R.SPAN_STEP}' "
        f"AND (attributes->>'{R.ATTR_STEP_WARMUP}')::BOOLEAN")
    first = server.sql("SELECT min(arrival_ts) AS t FROM requests")[0]["t"]
    assert rows[0]["n"] >= 10  # five lengths twice, the longest in chunks, two samplers
    if first is not None:
        assert rows[0]["last"] < first
