"""The work ahead of a newcomer: what stands between a request and its first token as
admission's deadline check (`slo.policy.feasibility`) sees it, read from the limiter
(what waits in front of the engine, what entered it and when), the load tracker (the
prompts the engine holds, started or waiting, and their engine priorities) and the
live engine model (the step in progress).
"""

from __future__ import annotations

from collections.abc import Sequence

from observe.record import AdmissionLoad
from serving.engine.live_model import LiveEngineModel
from serving.engine.load import LoadTracker
from serving.limiter import Limiter
from slo.policy import feasibility as F
from slo.policy import promises
from slo.policy.retry_book import Booking
from slo.sim.lanes import deadline_of_priority, engine_priority, kv_reserved_from

# Prompts sent to an idle engine within this of the first share the step it starts
# (vLLM's engine core takes what has come in before it schedules).
JOIN_S = 0.005


class WorkAheadView:
    def __init__(self, load: LoadTracker, limiter: Limiter, engine_model: LiveEngineModel):
        self.load = load
        self.limiter = limiter
        self.engine_model = engine_model

    def kv_free_tokens(self, usage: float | None = None) -> int:
        """KV-cache tokens free at `usage` (default: the engine's latest statistics)."""
        usage = self.load.kv_cache_usage if usage is None else usage
        return int(self.engine_model.model.kv_capacity_tokens * (1.0 - usage))

    def work_ahead(self, lane: str, load: AdmissionLoad, now: float,
                   deadline: float = float("inf"), rank: int = 0,
                   priority: int | None = None, vip_kv_reserve: int | None = None
                   ) -> F.WorkAhead:
        """What stands between a newcomer in `lane` due at `deadline` and its first
        token: the rest of the engine's step in progress (with the prefill chunk it
        took of the prompts the engine held when it began), the prompt tokens in the
        engine not yet prefilled beyond that chunk but those it will pass there (with
        engine `priority`: vLLM serves the prompts it has started first, then its
        waiting queue by priority), and those the limiter will let in before it (the
        lanes before its own, and those in its own ordered before it: a lower `rank`,
        or the same and due earlier); the KV cache free to it, less any `vip_kv_reserve`
        unless it is a VIP."""
        model, running = self.engine_model.model, load.running_requests
        waiting, waiting_pairs, _ = self.limiter.waiting_work()
        in_engine = max(0, load.pending_prefill_tokens - waiting)
        in_engine_pairs = max(0, load.pending_prefill_pairs - waiting_pairs)
        step, held_by, held = self._step_in_progress(now, running, in_engine, in_engine_pairs)
        ahead, ahead_pairs, ahead_prompts = self.limiter.waiting_work(lane, deadline, rank)
        passed, passed_pairs, passed_prompts = self.load.passed_by(
            priority, held_by, step.chunk, model.chunk_cap(running + max(1, held)))
        kv_free = (self.kv_free_tokens(load.kv_cache_usage) - step.chunk
                   - kv_reserved_from(lane, vip_kv_reserve))
        return F.WorkAhead(
            max(0, in_engine - step.chunk - passed) + ahead, running, step.remaining_s,
            self.limiter.slot_wait_s(lane, now),
            max(0, in_engine_pairs - step.chunk_pairs - passed_pairs) + ahead_pairs,
            max(0, self.limiter.engine_prefill_prompts - passed_prompts) + ahead_prompts,
            kv_free, self.limiter.kv_free_rate(now), self.load.preemptable_by(priority),
            self.load.kv_use_rate)

    def holds_back(self, tokens: int, priority: int, deadline: float, epoch: float,
                   now: float, coming: Sequence[Booking] = ()) -> bool:
        """Whether a prompt of `tokens` with engine `priority`, due at monotonic
        `deadline`, entering the engine now would make a prompt there, or a booked
        retry in `coming`, that is due before it miss its deadline
        (`slo.policy.promises`; engine priorities count deadlines from `epoch`)."""
        held = [p for p in self.load.in_engine if p.pending and p.left > 0]
        booked = [promises.Prompt(b.tokens, 0, engine_priority(b.lane, b.deadline, epoch),
                                  False, b.deadline - now, max(0.0, b.start - now))
                  for b in coming]
        if not any(p.priority < priority for p in (*held, *booked)):
            return False
        prompts = [promises.Prompt(p.left, p.computed, p.priority, not p.waiting,
                                   deadline_of_priority(p.priority, epoch) - now)
                   for p in held] + booked
        decodes = sum(1 for p in self.load.in_engine if not p.pending)
        since = self.engine_model.since_last_step_s(now)
        remaining = 0.0 if since is None else max(0.0, self.load.recent_step_s - since)
        return promises.holds_back(self.engine_model.model, decodes, prompts,
                                   promises.Prompt(tokens, 0, priority, False, deadline - now),
                                   remaining)

    def _step_in_progress(self, now: float, running: int, in_engine: int,
                          in_engine_pairs: int) -> tuple[F.StepInProgress, float | None, int]:
        """The engine's step in progress, until when prompts sent to the engine are held
        by it (None: no step seen yet), and how many prompts it holds. A busy engine
        began it as its last step ended, with the prompts it held then (not those sent
        since, which wait for the next step); an idle one (nothing running or held when
        its last step ended) begins one the moment a prompt comes, with that prompt and
        any sent with it (`JOIN_S`)."""
        model, since = self.engine_model.model, self.engine_model.since_last_step_s(now)
        if since is None:
            prompts = self.limiter.engine_prefill_prompts
            return F.step_in_progress(model, running, in_engine, None, in_engine_pairs,
                                      prompts), None, prompts
        entered, entered_pairs, entered_prompts = self.limiter.entered_since(now - since)
        held = (max(0, in_engine - entered), max(0, in_engine_pairs - entered_pairs),
                max(0, self.limiter.engine_prefill_prompts - entered_prompts))
        began = held_by = now - since
        if running <= 0 and held[0] <= 0:
            first = self.load.first_in_step(began, JOIN_S)
            if first is not None:
                began, held = first[0], first[1:]
                held_by = began + JOIN_S
        tokens, pairs, prompts = held
        step = F.step_in_progress(model, running, tokens, now - began, pairs, prompts)
        return step, held_by, prompts
