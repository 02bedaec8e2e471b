"""Protection, wired: the policy engine's once-a-second loop, its inputs (finished
requests, engine seconds, the memory forecast) and its outputs (decisions for
admission, the concurrency limit, events, gauges, an engine restart for breaker L2).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone
from typing import Protocol

from observe.record import RequestRecord
from observe.stats import EngineSnapshot
from serving.admin.overrides import OverrideStore
from serving.admission import Admission
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.guard.live_forecast import ForecastService
from serving.limiter import Limiter
from slo.policy import conditions as P
from slo.policy.decisions import Decisions
from slo.policy.engine import PolicyEngine
from slo.policy.lifecycle import ACTIVE

log = logging.getLogger("tailguard.policy")
TICK_S = 1.0


class GuardedServer(Protocol):
    """What the loop reads from the server it guards, and the one thing it may ask of
    it besides publishing decisions to admission: an engine restart (breaker L2)."""

    engine_failed: bool
    load: LoadTracker  # queue depth
    second: EngineSecond  # KV-cache usage
    forecast: ForecastService  # the KV-cache forecast
    admission: Admission  # where decisions are published
    handle: object | None  # `.engine.watchdog()`: the engine's hang check

    async def restart_engine(self) -> None: ...


class Guard:
    def __init__(self, config: P.PolicyConfig, tracelog, metrics, faults: FaultInjector):
        self.tracelog = tracelog
        self.faults = faults
        self.metrics = metrics
        self.engine = PolicyEngine(config, self._record_event, metrics.record_policy)
        self.limiter = Limiter(self.engine.batch.limit, config.queue_wait_s,
                               max_queue=config.max_queue)
        self.overrides = OverrideStore(tracelog, self.engine.machines)
        self.restarts = 0
        self._restarted_episode: float | None = None  # one restart per L2 activation
        self._restarting: asyncio.Task | None = None
        self._task: asyncio.Task | None = None
        self._refused_seen = 0  # admission's deadline refusals at the last tick
        self._woken = asyncio.Event()
        faults.on_set = self.wake  # a drill's failure trips breaker L2 at once too

    def _record_event(self, policy: str, from_state: str, to_state: str, reason: str,
                      details: dict) -> None:
        self.tracelog.add("policy_events", {
            "ts": datetime.now(timezone.utc), "policy": policy, "from_state": from_state,
            "to_state": to_state, "reason": reason, "details": details})

    # --- inputs (called by the runtime) ------------------------------------------------

    def on_request(self, rec: RequestRecord) -> None:
        self.engine.on_request(rec)

    def on_engine_second(self, snap: EngineSnapshot) -> None:
        busy = (snap.mean_step_s or 0.0) * snap.steps  # seconds stepping in this second
        self.engine.on_engine_second(min(1.0, busy), kv_usage=snap.kv_cache_usage)

    # --- the loop ------------------------------------------------------------------------

    def start(self, runtime: GuardedServer) -> None:
        restored = self.overrides.restore()
        if restored:
            log.warning("overrides in force from before the restart: %s", ", ".join(restored))
        self.tick(runtime)
        self._task = asyncio.create_task(self._run(runtime))

    async def _run(self, runtime: GuardedServer) -> None:
        while True:
            await self._until_next_tick()
            self._safe_tick(runtime)

    def _safe_tick(self, runtime: GuardedServer) -> None:
        try:
            self.tick(runtime)
        except Exception:  # the loop must outlive any one bad evaluation
            log.exception("policy evaluation failed")

    def wake(self) -> None:
        """Tick now: the engine failed under a request (or a drill says it did), and
        breaker L2 trips and restarts it at once rather than up to a second later. An
        engine that dies with no request in it is found at the next tick. (Polling for
        the failure ten times a second instead cost an idle server about 2 ms of CPU a
        second: docs/benchmarks.md, "Idle".)"""
        if self.engine.machines[P.BREAKER_L2].state != ACTIVE:
            self._woken.set()

    async def _until_next_tick(self) -> None:
        """`TICK_S`, cut short by `wake()`."""
        try:
            await asyncio.wait_for(self._woken.wait(), TICK_S)
        except asyncio.TimeoutError:
            pass
        self._woken.clear()

    def tick(self, runtime: GuardedServer, now: float | None = None) -> Decisions:
        now = time.time() if now is None else now
        self._watch_engine(runtime)
        admission = runtime.admission
        model = admission.engine_model
        model.refit()
        refused, self._refused_seen = (admission.refused_deadline - self._refused_seen,
                                       admission.refused_deadline)
        pending = runtime.load.pending[0]
        signals = self.engine.signals(
            now, engine_failed=runtime.engine_failed, queue_depth=pending,
            kv_usage=runtime.second.kv_cache_usage, kv_forecast=runtime.forecast.latest,
            stalled_s=model.stalled_s(time.monotonic(), pending > 0),
            deadline_refusals=refused)
        decisions = self.engine.evaluate(signals, saturated=self.limiter.slots_full)
        self.metrics.record_kv_exhaustion(signals.kv_exhaustion_s)
        admission.length_classes.roll(time.monotonic())  # re-buckets on time when idle too
        self.metrics.record_length_bounds(*admission.length_classes.bounds)
        self.limiter.limit = decisions.concurrency_limit
        steps = decisions.prefill_gate_steps
        self.limiter.prefill_gate = (None if steps is None
                                     else round(steps * model.model.token_budget))
        self.limiter.kv_reserve = decisions.vip_kv_reserve
        runtime.admission.publish(decisions)
        l2 = self.engine.machines[P.BREAKER_L2]
        if l2.state == ACTIVE and l2.since != self._restarted_episode:
            self._restarted_episode = l2.since
            self._restarting = asyncio.create_task(self._restart(runtime))
        return decisions

    @staticmethod
    def _watch_engine(runtime: GuardedServer) -> None:
        """The engine watchdog (a hung engine raises no exception): it kills an engine
        that stopped making progress under requests, so `engine_failed` trips L2."""
        handle = getattr(runtime, "handle", None)
        watchdog = getattr(getattr(handle, "engine", None), "watchdog", None)
        if callable(watchdog):
            watchdog()

    async def _restart(self, runtime: GuardedServer) -> None:
        self.restarts += 1
        self._record_event(P.BREAKER_L2, "active", "active", "restarting the engine",
                           {"restart": self.restarts})
        try:
            await runtime.restart_engine()
            if self.faults.failing:
                self.faults.set("none")  # a drill's failure ends with the restart
        except Exception as exc:
            log.exception("engine restart failed")
            self._record_event(P.BREAKER_L2, "active", "active", f"restart failed: {exc}", {})
        self._safe_tick(runtime)  # the breaker lets go now, not at the next tick

    def stop(self) -> None:
        if self._task:
            self._task.cancel()
