"""A discrete-event simulation of one tailguard replica: admission (the policies'
decisions, the limiter's three lanes, prefill gate, VIP KV reserve, `slo.sim.lanes`,
and promise keeper, `slo.policy.promises`) in front of a continuous-batching engine
(`EngineModel`: chunked prefill within a token budget, one decode token per running
request per step, vLLM's KV cache: a waiting prompt starts only when all of it fits
what is free, blocks are taken chunk by chunk, the newest request is preempted when
decodes outgrow it; with priority scheduling, tailguard's default, waiting prompts go
in admission's order, lane then deadline, and the victim is the latest-due of the
lowest lane), with the real `PolicyEngine` stepped once per simulated second on the
signals the server would have seen.

Admission's deadline check is the server's (`slo.policy.feasibility.judge` on the
same engine model, work ahead in the request's lane, the slot wait from the recent
release rate, the KV wait from the KV ending requests freed lately); a request
arriving during a step is judged as on its arrival, the rest of that step ahead of it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from observe import registry as R
from slo.policy import conditions as P
from slo.policy import feasibility as F
from slo.policy.decisions import Decisions
from slo.policy.engine import PolicyEngine
from slo.policy.playout import Prompt
from slo.policy.promises import holds_back
from slo.policy.vip_stream import VipStream
from slo.sim import kv_cache
from slo.sim.engine_model import EngineModel, attention_pairs
from slo.sim.lanes import (LANE_VIP, RELEASE_WINDOW_S, Lanes, deadline_of, engine_priority,
                           enters_at_once, gate_fits, kv_fits, kv_reserved_from, lane_of,
                           slot_wait_s, vip_priority, vips_first)
from slo.sim.request import REJECTED, SimRequest

LIMITER_MAX_WAIT_S = 120.0  # serving.limiter.Limiter's default


class Simulator:
    def __init__(self, model: EngineModel, config: P.PolicyConfig | None,
                 limit: int | None = None, priority_scheduling: bool = True):
        """`config` None: no policies; the concurrency limit stays at `limit` (default
        the config's `batch_initial`); `priority_scheduling` False: vLLM's first-come
        order (`--scheduling-policy fcfs`)."""
        self.model = model
        self.priority_scheduling = priority_scheduling
        self.config = config or P.PolicyConfig()
        self.policies = (PolicyEngine(self.config, lambda *a: None, lambda *a: None)
                         if config is not None else None)
        self.decisions = Decisions(concurrency_limit=limit or self.config.batch_initial)
        self.lanes = Lanes()
        self.running: list[SimRequest] = []
        self.now = 0.0
        self.busy = 0.0  # engine seconds in the current simulated second
        self.transitions: list[tuple[float, str]] = []
        # when requests left the engine lately, and the KV tokens each held
        self.releases: deque[tuple[float, int]] = deque()
        self.refused = 0  # by the deadline check since the last policy tick
        self.vips = VipStream()  # as admission's: VIP work still to come
        self.kv_use_rate = 0.0

    # --- admission ---------------------------------------------------------------------

    def arrive(self, req: SimRequest) -> None:
        d = self.decisions
        if d.restarting or (d.shed_non_vip and not req.vip):
            self._reject(req, f"shed:{d.shed_non_vip or P.BREAKER_L2}")
            return
        if d.max_tokens_cap is not None and (req.max_tokens or 1 << 30) > d.max_tokens_cap:
            req.max_tokens = d.max_tokens_cap
            req.output = min(req.output, d.max_tokens_cap)
            req.actions.append(f"cap_max_tokens:{d.max_tokens_cap}")
        if d.truncate_tokens is not None and req.prompt > d.truncate_tokens:
            req.actions.append(f"truncate:{req.prompt}->{d.truncate_tokens}")
            req.prompt = d.truncate_tokens
        if req.target_s is not None and lane_of(req) == LANE_VIP:
            self.vips.arrived(req.prompt, self.now)
        if d.deadline_margin is not None and req.target_s is not None:
            # judged as the server does on its arrival, the step it came during ahead
            seen = req.arrival + self.model.overhead_s
            left = req.target_s - self.model.overhead_s
            ahead = self._work_ahead(req, self.now - seen)
            if lane_of(req) != LANE_VIP:
                ahead = self.vips.ahead_of(ahead, left, self.now, self._priority(req) is not None)
            ahead = replace(ahead, shares_steps=not self._holds_back(req))  # else waits
            check = F.judge(self.model, req.prompt, ahead, left, vip=req.vip,
                            truncate_to=d.deadline_truncate_tokens,
                            margin=d.deadline_margin, slowdown=d.slowdown,
                            overloaded=d.refusing_late)
            if check.action in (F.REFUSE, F.DEFER):  # DEFER: late even idle, in a surge
                late = check.action == F.REFUSE
                self._reject(req, "refuse:deadline" if late else "refuse:unattainable")
                self.refused += late  # what the predicted-miss policy reads
                return
            if check.action == F.TRUNCATE:
                req.actions.append(f"truncate:{req.prompt}->{check.truncate_to}")
                req.prompt = check.truncate_to
            if check.action == F.BEST_EFFORT and req.priority == R.PRIORITY_REALTIME:
                req.priority = R.PRIORITY_BATCH
                req.actions.append("demote:unattainable")
        self.lanes.push(req, LANE_VIP if req.booked else None)  # a booked retry: at once

    def _work_ahead(self, req: SimRequest, step_left_s: float = 0.0) -> F.WorkAhead:
        """As `serving.guard.work_ahead.WorkAheadView`: prompt tokens in the engine not
        yet prefilled (but those waiting there that it passes: due after it), those
        waiting in its lane or before it, the slot wait."""
        self._forget_releases()
        lane, mine = lane_of(req), self._priority(req)
        queue = [Prompt(max(0, (r.context or r.prompt) - r.prefilled), r.prefilled, 0, r.started,
                        vip=mine is not None and vip_priority(r.engine_priority))
                 for r in self.running if r.started or mine is None or r.engine_priority <= mine]
        waiters = [] if req.booked else list(self.lanes.ahead(lane, deadline_of(req)))
        queue = [p for p in queue + [Prompt(r.prompt, 0, 0, False) for r in waiters] if p.left]
        slot_wait_s = 0.0 if enters_at_once(lane, req.booked) else \
            self._slot_wait_s(len(waiters))
        # vLLM's running count: the decodes and the prompts it has started
        running = sum(1 for r in self.running if r.first_token is not None or r.started)
        reserve = kv_reserved_from(lane, self.decisions.vip_kv_reserve)
        free = self.model.kv_capacity_tokens - kv_cache.allocated(self.running) - reserve
        freed = sum(tokens for _, tokens in self.releases) / RELEASE_WINDOW_S
        return F.queued(queue, running, step_remaining_s=step_left_s, slot_wait_s=slot_wait_s,
                        kv_free_tokens=free, kv_free_rate=freed, kv_use_rate=self.kv_use_rate,
                        kv_release_rate=len(self.releases) / RELEASE_WINDOW_S,
                        kv_preemptable=kv_cache.preemptable(self.running, mine),
                        own_vip=mine is not None and lane == LANE_VIP)

    def _priority(self, req: SimRequest) -> int | None:
        """Its engine priority under vLLM's priority scheduling (None: arrival order)."""
        if self.priority_scheduling and self.decisions.deadline_margin is not None:
            return engine_priority(lane_of(req), deadline_of(req), 0.0)
        return None

    def _holds_back(self, req: SimRequest) -> bool:
        """Admission's promise keeper (`slo.policy.promises`) on the simulated engine."""
        mine = self._priority(req)
        if mine is None or not self.decisions.keep_promises \
                or enters_at_once(lane_of(req), req.booked):
            return False
        waiting = [r.pending_prompt(self.now) for r in self.running if r.first_token is None]
        return holds_back(self.model, len(self.running) - len(waiting), waiting,
                          req.pending_prompt(self.now, mine))

    def _slot_wait_s(self, ahead: int) -> float:
        over = len(self.running) - self.decisions.concurrency_limit  # VIPs past it; a cut
        if over < 0 and not ahead:
            return 0.0
        self._forget_releases()
        return slot_wait_s(ahead, over, len(self.releases))

    def _forget_releases(self) -> None:
        while self.releases and self.releases[0][0] < self.now - RELEASE_WINDOW_S:
            self.releases.popleft()

    def _reject(self, req: SimRequest, action: str) -> None:
        req.status = REJECTED
        req.actions.append(action)
        req.end = self.now

    def _fill_slots(self) -> None:
        """Hand free slots to the waiters, as the server's limiter does (`Lanes`)."""
        d = self.decisions
        if d.deadline_margin is not None:
            self.lanes.demote_late(self.now, lambda r: F.prefill_s(self.model, r.prompt, 0))
        gate = None if d.prefill_gate_steps is None else \
            round(d.prefill_gate_steps * self.model.token_budget)

        def fits(req: SimRequest) -> bool:
            pending = self._pending_prefill()
            return len(self.running) < d.concurrency_limit and gate_fits(
                sum(pending), req.prompt, gate, sum(1 for left in pending if left > 0),
                self.model.prefill_chunk_cap) and kv_fits(
                self.model.kv_capacity_tokens - kv_cache.allocated(self.running), sum(pending),
                req.prompt, d.vip_kv_reserve, len(self.running)) and not self._holds_back(req)
        for req in self.lanes.pop_ready(fits):
            if self.now - req.arrival > LIMITER_MAX_WAIT_S:
                self._reject(req, "admission_timeout")
                continue
            req.admitted = self.now
            req.engine_priority = self._priority(req) or 0
            self.running.append(req)

    def _pending_prefill(self) -> list[int]:
        """Prompt tokens in the engine not yet prefilled, a prompt each."""
        return [(r.context or r.prompt) - r.prefilled for r in self.running
                if r.first_token is None]

    # --- the engine ----------------------------------------------------------------------

    def step(self) -> bool:
        """One engine step over the running requests; False if there was nothing to do."""
        decoding = kv_cache.make_room(self.running, self.model.kv_capacity_tokens)
        budget = self.model.token_budget - len(decoding)
        chunks = self._chunks(budget, self.model.kv_capacity_tokens
                              - kv_cache.allocated(self.running) - len(decoding))
        if not decoding and not chunks:
            return False
        tokens = len(decoding) + sum(take for _, take in chunks)
        pairs = sum(attention_pairs(r.context + r.decoded - 1, 1) for r in decoding) \
            + sum(attention_pairs(r.prefilled, take) for r, take in chunks)
        dt = self.model.step_s(len(decoding) + len(chunks), tokens, pairs)
        self.kv_use_rate = tokens / dt  # KV tokens the running requests take a second
        self.now += dt
        self.busy += dt
        for r in decoding:
            r.generated += 1
            r.decoded += 1
        for r, take in chunks:
            r.prefilled += take
            if r.prefilled >= r.context:  # the prefill's last chunk samples a token
                r.generated += 1
                r.decoded = 1
                r.first_token = r.first_token or self.now
        self._finish()
        return True

    def _chunks(self, budget: int, kv_free: int) -> list[tuple[SimRequest, int]]:
        """The prefill chunks of this step, as vLLM schedules them: its running requests
        first, then its waiting ones in order, starting one only when its whole prompt
        fits the free KV cache (and none behind one that does not); blocks are taken
        chunk by chunk, so a started prompt's later chunks need room when they come.
        With a VIP prompt to prefill, the VIPs' alone (a lone one uncapped)."""
        cap = self.model.chunk_cap(len(self.running)) or budget
        order = sorted(self.running, key=lambda r: (not r.started,
                                                    0 if r.started else r.engine_priority))
        vips, chunks = vips_first(order, kv_free), []
        if vips:  # the engine's VIP-first scheduler (`serving.guard.vip_first`)
            order, cap = vips, budget if len(vips) == 1 else cap
        for r in order:
            if budget <= 0:
                break
            if not r.started:
                r.context = r.context or r.prompt
                if r.context > self.model.kv_capacity_tokens:  # vLLM refuses it up front
                    self.running.remove(r)
                    self._reject(r, "kv_cache_too_small")
                    continue
                if r.context > kv_free:
                    break
                r.started = True
            take = min(r.context - r.prefilled, budget, cap, kv_free)
            if take > 0:
                chunks.append((r, take))
                budget -= take
                kv_free -= take
        return chunks

    def _finish(self) -> None:
        done = [r for r in self.running if r.first_token is not None
                and r.generated >= max(1, r.output)]
        for r in done:
            r.end = self.now
            self.running.remove(r)
            self.releases.append((self.now, r.context + r.decoded))
            if self.policies is not None:
                self.policies.on_outcome(self.now, False, r.ttft_s)

    # --- policies ------------------------------------------------------------------------

    def evaluate(self, at: float) -> None:
        """The server's once-a-second policy tick, at simulated time `at`."""
        if self.policies is None:
            return
        self.policies.on_engine_second(min(1.0, self.busy), at)
        self.busy = 0.0
        waiting = len(self.lanes)
        unstarted = sum(1 for r in self.running if r.first_token is None)
        kv = kv_cache.allocated(self.running) / self.model.kv_capacity_tokens
        signals = self.policies.signals(at, False, waiting + unstarted, min(1.0, kv), None,
                                        deadline_refusals=self.refused)
        self.refused, before = 0, self.decisions.active
        saturated = waiting > 0 and len(self.running) >= self.decisions.concurrency_limit
        self.decisions = self.policies.evaluate(signals, saturated=saturated)
        if self.decisions.active != before:
            self.transitions.append((at, ",".join(self.decisions.active) or "none"))

    def run(self, requests: list[SimRequest]) -> list[SimRequest]:
        """Simulate `requests` (sorted by arrival); they are updated in place."""
        arrivals, next_tick = deque(requests), 1.0
        overhead = self.model.overhead_s  # HTTP and tokenizing before admission
        while arrivals or self.running or self.lanes:
            while arrivals and arrivals[0].arrival + overhead <= self.now:
                self.arrive(arrivals.popleft())
            while next_tick <= self.now:
                self.evaluate(next_tick)
                next_tick += 1.0
            self._fill_slots()
            if not self.step():
                idle_until = min(arrivals[0].arrival + overhead if arrivals else float("inf"),
                                 next_tick if self.policies is not None else float("inf"))
                if idle_until == float("inf"):
                    if self.lanes:  # a limit of 0 cannot happen; be safe
                        self.now += 1.0
                        continue
                    break
                self.now = max(self.now, idle_until)
        return requests
