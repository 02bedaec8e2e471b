"""The work ahead of a newcomer: what stands between a request and its first token as
admission's deadline check (`slo.policy.feasibility`) sees it, read from the limiter
(what waits in front of the engine), the load tracker (the prompts the engine holds,
started or waiting, when each entered, and their engine priorities) and the live
engine model (the step in progress), one prompt at a time (`slo.policy.playout`).
"""

from __future__ import annotations

from collections.abc import Sequence

from observe.record import AdmissionLoad
from serving.engine.live_model import LiveEngineModel
from serving.engine.load import LoadTracker
from serving.limiter import Limiter
from slo.policy import feasibility as F
from slo.policy import playout, promises
from slo.policy.playout import Prompt
from slo.policy.retry_book import Booking
from slo.sim.lanes import LANE_VIP, deadline_of_priority, engine_priority, kv_reserved_from
from slo.sim.lanes import vip_priority

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
                   priority: int | None = None, vip_kv_reserve: int | None = None,
                   booked: bool = False) -> F.WorkAhead:
        """What stands between a newcomer in `lane` due at `deadline` and its first
        token, prompt by prompt: the rest of the engine's step in progress (with the
        chunks it took of the prompts the engine held when it began), the prompts in
        the engine not yet prefilled but those it will pass there (with engine
        `priority`: vLLM serves the prompts it has started first, then its waiting
        queue by priority), and those the limiter will let in before it (the lanes
        before its own, and those in its own ordered before it: a lower `rank`, or the
        same and due earlier); the KV cache free to it, less any `vip_kv_reserve`
        unless it is a VIP. `booked`: a retry back for its booking, which enters at
        once (`Limiter.acquire`): nobody waiting in front is ahead of it."""
        model, running = self.engine_model.model, load.running_requests
        remaining, chunks = self._step_in_progress(now, running, priority is not None)
        queue = self._in_engine(chunks, priority)
        untracked = (load.pending_prefill_tokens - sum(self.limiter.waiting_prompts())
                     - sum(p.left for p in self.load.in_engine if p.pending))
        if untracked > 0:  # counted by the tracker, not by any prompt: one fresh prompt
            queue.append(Prompt(untracked, 0, 0, False))
        if not booked:
            queue += [Prompt(tokens, 0, 0, False)
                      for tokens in self.limiter.waiting_prompts(lane, deadline, rank)]
        kv_free = (self.kv_free_tokens(load.kv_cache_usage) - sum(chunks.values())
                   - kv_reserved_from(lane, vip_kv_reserve))
        return F.queued(
            queue, running, step_remaining_s=remaining,
            slot_wait_s=self.limiter.slot_wait_s(lane, now, booked), kv_free_tokens=kv_free,
            slot_wait_mean_s=self.limiter.slot_wait_s(lane, now, booked, p90=False),
            kv_free_rate=self.limiter.kv_free_rate(now),
            kv_release_rate=self.limiter.release_rate(now),
            kv_preemptable=self.load.preemptable_by(priority), kv_use_rate=self.load.kv_use_rate,
            own_vip=priority is not None and lane == LANE_VIP)

    def holds_back(self, tokens: int, priority: int, deadline: float, epoch: float,
                   now: float, coming: Sequence[Booking] = ()) -> bool:
        """Whether a prompt of `tokens` with engine `priority`, due at monotonic
        `deadline`, entering the engine now would make a prompt there, or a booked
        retry in `coming`, that is due before it miss its deadline
        (`slo.policy.promises`; engine priorities count deadlines from `epoch`)."""
        held = [p for p in self.load.in_engine if p.pending and p.left > 0]
        booked = [Prompt(b.tokens, 0, engine_priority(b.lane, b.deadline, epoch), False,
                         b.deadline - now, max(0.0, b.start - now)) for b in coming]
        if not any(p.priority < priority for p in (*held, *booked)):
            return False
        prompts = [Prompt(p.left, p.computed, p.priority, not p.waiting,
                          deadline_of_priority(p.priority, epoch) - now,
                          vip=vip_priority(p.priority)) for p in held] + booked
        decodes = sum(1 for p in self.load.in_engine if not p.pending)
        since = self.engine_model.since_last_step_s(now)
        remaining = 0.0 if since is None else max(0.0, self.load.recent_step_s - since)
        return promises.holds_back(self.engine_model.model, decodes, prompts,
                                   Prompt(tokens, 0, priority, False, deadline - now),
                                   remaining)

    def _step_in_progress(self, now: float, running: int,
                          vip_first: bool) -> tuple[float, dict]:
        """The rest of the engine's step in progress, and the chunk it takes of each
        prompt it holds. A busy engine began it as its last step ended, with the
        prompts it held then (not those sent since, which wait for the next step); an
        idle one (nothing running or held when its last step ended) begins one the
        moment a prompt comes, with that prompt and any sent with it (`JOIN_S`). Its
        chunks go as vLLM's scheduler gives them (`playout.step_chunks`); its phase
        unknown (no step seen yet, or it runs past the model), half of it is left.
        `vip_first`: under priorities (the engine prefills VIP prompts first)."""
        model, since = self.engine_model.model, self.engine_model.since_last_step_s(now)
        pending = [p for p in self.load.in_engine if p.pending and p.left > 0]
        began, held = None, pending
        if since is not None:
            began = now - since
            held = [p for p in pending if p.entered_at <= began]
            if running <= 0 and not held:
                came = [p for p in pending if p.waiting and p.entered_at > began]
                if came:
                    began = min(p.entered_at for p in came)
                    held = [p for p in came if p.entered_at <= began + JOIN_S]
        if running <= 0 and not held:
            return 0.0, {}
        held.sort(key=lambda p: (p.waiting, p.priority, p.entered_at))
        left = [p.left for p in held]
        decodes = max(0, running - sum(not p.waiting for p in pending))
        vips = [vip_first and vip_priority(p.priority) for p in held]
        _, n, tokens, pairs = playout.step_chunks(model, decodes, list(range(len(held))), left,
                                                  [p.computed for p in held], vips)
        step = model.step_s(decodes + n, decodes + tokens, pairs)
        elapsed = None if began is None else now - began
        remaining = step - elapsed if elapsed is not None and 0 <= elapsed < step else 0.5 * step
        return remaining, {p: p.left - rest for p, rest in zip(held, left) if p.left > rest}

    def _in_engine(self, chunks: dict, priority: int | None) -> list[Prompt]:
        """The engine's prompts after the step in progress takes `chunks`, in vLLM's
        order: the started ones, then the waiting ones by priority and arrival, but
        those a newcomer with engine `priority` passes (None: it passes none)."""
        prompts = []
        for p in self.load.in_engine:
            chunk = chunks.get(p, 0)
            started = not p.waiting or chunk > 0
            if not p.pending or p.left <= chunk or (
                    not started and priority is not None and p.priority > priority):
                continue
            vip = priority is not None and vip_priority(p.priority)
            prompts.append((not started, p.priority, p.entered_at,
                            Prompt(p.left - chunk, p.computed + chunk, 0, started, vip=vip)))
        return [prompt for *_, prompt in sorted(prompts, key=lambda e: e[:3])]
