"""The policy engine: once a second it reads the in-memory windows, steps every
policy's state machine and the batch controller, records each transition
(`policy_events`, `tailguard_policy_active`), and publishes one `Decisions` object that
admission applies to the next requests. The server runs it on the clock; the replay
runs the same object in simulated time (every method takes `now`).
"""

from __future__ import annotations

import logging
import time

from observe import registry as R
from observe.record import RequestRecord
from slo.policy import conditions as P
from slo.policy.batch_size import BatchController
from slo.policy.decisions import Decisions, decide
from slo.policy.lifecycle import ACTIVE, FORCE_OFF, INACTIVE, PolicyMachine, Transition
from slo.policy.live_windows import OutcomeWindow, SampleWindow, quantile, time_to_full

log = logging.getLogger("tailguard.policy")
BREAKER_WINDOW_S = 10.0  # the window of the breaker's signs (off-model, errors)
KV_TREND_S = 30.0  # the KV cache's time to full is read from this much of its history


def _never(signals, config, active):
    return False, "a controller, not a condition", {}


class PolicyEngine:
    def __init__(self, config: P.PolicyConfig, record_event, set_gauge):
        self.config = config
        self._record_event = record_event  # (policy, from, to, reason, details) -> None
        self._set_gauge = set_gauge  # (policy, 0/1) -> None
        table = P.policy_table(config)
        self.conditions = {name: cond for name, (cond, _) in table.items()}
        self.machines = {name: PolicyMachine(name, timing)
                         for name, (_, timing) in table.items()}
        # Batch control is a controller, always on; its machine only carries an
        # operator's override (force_off: the limit stays at the cap).
        self.conditions[P.BATCH_CONTROL] = _never
        self.machines[P.BATCH_CONTROL] = PolicyMachine(P.BATCH_CONTROL, config.timing())
        self.batch = BatchController(config)
        self._batch_held = False  # force_off holds the limit at the cap
        self.ttft = SampleWindow(60.0)
        self.off_model = SampleWindow(BREAKER_WINDOW_S)  # observed / estimated TTFT
        self.outcomes = OutcomeWindow(BREAKER_WINDOW_S * 3)
        self.busy = SampleWindow(10.0)  # engine busy share per second
        self.kv = SampleWindow(KV_TREND_S)  # KV-cache usage per second
        self.last_signals: P.Signals | None = None
        self.decisions: Decisions = decide({}, self.batch.limit, config)

    # --- inputs -------------------------------------------------------------------

    def on_request(self, rec: RequestRecord, now: float | None = None) -> None:
        now = time.time() if now is None else now
        ok = rec.status == R.STATUS_OK
        self.on_outcome(now, rec.status == R.STATUS_ERROR, rec.ttft_s if ok else None)
        if ok and rec.ttft_s is not None and rec.ttft_estimate_s:
            self.off_model.add(now, rec.ttft_s / rec.ttft_estimate_s)

    def on_outcome(self, now: float, error: bool, ttft_s: float | None) -> None:
        """A finished request: whether it failed (5xx) and its TTFT if it succeeded."""
        self.outcomes.add(now, error)
        if ttft_s is not None:
            self.ttft.add(now, ttft_s)

    def on_engine_second(self, busy_share: float, now: float | None = None,
                         kv_usage: float | None = None) -> None:
        now = time.time() if now is None else now
        self.busy.add(now, busy_share)
        if kv_usage is not None:
            self.kv.add(now, kv_usage)

    # --- evaluation ---------------------------------------------------------------

    def signals(self, now: float, engine_failed: bool, queue_depth: int, kv_usage: float,
                kv_forecast: float | None, stalled_s: float = 0.0,
                deadline_refusals: int = 0) -> P.Signals:
        window = self.ttft.values(now, BREAKER_WINDOW_S)
        busy = self.busy.values(now)
        ratios = self.off_model.values(now)
        off_model = (quantile(ratios, 0.5) if len(ratios) >= self.config.breaker_min_requests
                     else None)
        return P.Signals(now=now, p99_s=quantile(window, 0.99),
                         error_rate=self.outcomes.error_rate(now),
                         engine_failed=engine_failed, queue_depth=queue_depth,
                         load=sum(busy) / len(busy) if busy else 0.0, kv_usage=kv_usage,
                         kv_forecast=kv_forecast, requests=len(window),
                         kv_exhaustion_s=time_to_full(self.kv.points(now)),
                         off_model=off_model, stalled_s=stalled_s,
                         deadline_refusals=deadline_refusals)

    def evaluate(self, signals: P.Signals, saturated: bool = False) -> Decisions:
        """`saturated`: requests are waiting for an engine slot (batch control)."""
        now = signals.now
        self.last_signals = signals
        for name, machine in self.machines.items():
            gone = machine.expire_override(now)
            if gone is not None:
                self._event(Transition(name, gone.mode, "auto", "override expired",
                                       {"actor": gone.actor}, now))
            breached, reason, details = self.conditions[name](
                signals, self.config, machine.state != INACTIVE)
            moved = machine.step(now, breached, reason, details)
            if moved is not None:
                self._event(moved)
        self._control_batch(now, signals.load, saturated)
        states = self.effective_states()
        for name, state in states.items():
            self._set_gauge(name, 1 if state == ACTIVE else 0)
        self._set_gauge(P.BATCH_CONTROL, int(self.batch.limit < self.config.batch_cap))
        forced_off = frozenset(name for name, m in self.machines.items()
                               if m.override is not None and m.override.mode == FORCE_OFF)
        self.decisions = decide(states, self.batch.limit, self.config, self.config.backoff_s,
                                forced_off, signals.off_model or 1.0)
        return self.decisions

    def _control_batch(self, now: float, load: float, saturated: bool) -> None:
        override = self.machines[P.BATCH_CONTROL].override
        if override is not None and override.mode == FORCE_OFF:
            self.batch.limit = self.config.batch_cap
            self._batch_held = True
            return
        if self._batch_held:  # the override lifted or expired: start over, as a new server
            # does; left at the cap, the controller takes a cut per 15 s of slow windows
            # to come down while the KV cache overflows (a 10x surge right after the
            # override kept 85% of admitted realtime requests on time, 95% starting over)
            self._batch_held = False
            self.batch = BatchController(self.config)
            self._record_event(P.BATCH_CONTROL, f"limit={self.config.batch_cap}",
                               f"limit={self.batch.limit}", "override lifted: control "
                               "starts over", {})
        batch_p99 = quantile(self.ttft.values(now, self.config.batch_window_s), 0.99)
        change = self.batch.step(now, batch_p99, load, saturated)
        if change is not None:
            self._record_event(P.BATCH_CONTROL, f"limit={change.old}", f"limit={change.new}",
                               change.reason, change.details)

    def effective_states(self) -> dict[str, str]:
        return {name: m.effective for name, m in self.machines.items()
                if name != P.BATCH_CONTROL}

    def _event(self, moved: Transition) -> None:
        log.info("policy %s: %s -> %s (%s)", moved.policy, moved.from_state, moved.to_state,
                 moved.reason)
        self._record_event(moved.policy, moved.from_state, moved.to_state, moved.reason,
                           moved.details)

    def describe(self) -> list[dict]:
        out = []
        for name, m in self.machines.items():
            o = m.override
            out.append({"policy": name, "state": m.state, "effective": m.effective,
                        "since": m.since or None, "reason": m.reason or None,
                        "backoff_s": m.backoff_s,
                        "override": None if o is None else {
                            "mode": o.mode, "reason": o.reason, "actor": o.actor,
                            "created": o.created, "expires": o.expires}})
        batch = out[-1]  # the controller: on unless forced off
        forced_off = batch["override"] is not None and batch["override"]["mode"] == FORCE_OFF
        batch.update(state=ACTIVE, effective=INACTIVE if forced_off else ACTIVE,
                     limit=self.batch.limit, initial=self.config.batch_initial,
                     cap=self.config.batch_cap)
        return out
