"""Admission: what happens to a request between the HTTP layer and the engine.

Two points, because what is known grows on the way in:
- `check_http` (body parsed, not tokenized): the engine restarting, shedding
  non-VIP load, the max_tokens cap;
- `admit` (tokenized, just before the engine): the load it meets, truncation, the
  deadline check (`slo.policy.feasibility`: can its first token still come in time
  given the work ahead of it in its lane, `serving.guard.work_ahead`? if not,
  truncate where a policy allows it and that suffices, else refuse at once with 429
  and the predicted drain time as Retry-After), its predicted latency, any injected
  fault, then the limiter: a concurrency limit and a prefill gate in front of the
  engine, VIP, realtime and batch lanes, earliest deadline first within each
  (`serving.limiter`); the same order is its engine priority (`Admitted.priority`).
Each decision lands in `policy_actions` (span and row); a refusal is a `Refusal`,
which the HTTP layer answers (`serving.errors`); `publish()` takes the policy loop's decisions.
"""

from __future__ import annotations

import time
from dataclasses import replace

from observe import registry as R
from observe.record import AdmissionLoad, RequestRecord
from serving.engine.fault_injection import FaultInjector
from serving.engine.live_model import LiveEngineModel
from serving.engine.load import LoadTracker, PrefillEnd
from serving.guard.live_predictor import PredictionService
from serving.guard.verdicts import Admitted, Refusal, shed_refusal
from serving.guard.work_ahead import WorkAheadView
from serving.limiter import Limiter, LimiterFull, LimiterTimeout
from slo.policy import feasibility as F
from slo.policy.decisions import Decisions
from slo.policy.length_classes import LengthClasses, class_of
from slo.policy.retry_book import RETRY_BOOKED, RetryBook
from slo.policy.vip_stream import VipStream
from slo.sim.lanes import LANE_VIP, engine_priority, lane_of


class Admission:
    def __init__(self, load: LoadTracker, predictor: PredictionService, limiter: Limiter,
                 faults: FaultInjector, ttft_target=None,
                 engine_model: LiveEngineModel | None = None,
                 length_classes: LengthClasses | None = None):
        self.load = load
        self.predictor = predictor
        self.limiter = limiter
        self.faults = faults
        self.ttft_target = ttft_target  # prompt tokens -> TTFT target s, or None
        self.engine_model = engine_model or LiveEngineModel()
        self.length_classes = length_classes or LengthClasses()
        self.decisions = Decisions(concurrency_limit=limiter.limit)
        self.refused_deadline = 0  # requests refused by the deadline check (a counter)
        self.retries = RetryBook(max_retry_after_s=F.MAX_RETRY_AFTER_S)
        self.vips = VipStream()  # VIP prompts admitted lately: work ahead still to come
        self.ahead = WorkAheadView(load, limiter, self.engine_model)
        limiter.kv_free = self.kv_free_tokens  # the VIP reserve's reading
        limiter.holds_back = self.holds_back
        self.epoch = time.monotonic()  # engine priorities count deadlines from here

    def kv_free_tokens(self, usage: float | None = None) -> int:
        """KV-cache tokens free at `usage` (default: the engine's latest statistics)."""
        return self.ahead.kv_free_tokens(usage)

    def publish(self, decisions: Decisions) -> None:
        """The policy loop's latest decisions; every later request is admitted by them."""
        self.decisions = decisions

    def check_http(self, rec: RequestRecord, request) -> Refusal | None:
        """Refuse now, or cap the request's max_tokens in place and let it on."""
        d = self.decisions
        if d.restarting:
            rec.policy_actions.append("reject:breaker_l2")
            return Refusal("engine_restarting", "the engine is restarting", d.retry_after_s)
        if d.shed_non_vip and not rec.vip:
            rec.policy_actions.append(f"shed:{d.shed_non_vip}")
            return shed_refusal(d.shed_non_vip, d.retry_after_s)
        if d.max_tokens_cap is not None:
            for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                asked = getattr(request, field, None)
                if hasattr(request, field) and (asked is None or asked > d.max_tokens_cap):
                    setattr(request, field, d.max_tokens_cap)
                    rec.policy_actions.append(f"cap_max_tokens:{d.max_tokens_cap}")
                    break
        return None

    async def admit(self, rec: RequestRecord, prompt, prompt_tokens: int,
                    max_tokens: int | None) -> Admitted | Refusal:
        """Waits for an engine slot. Once admitted, the caller must call `release()`
        when the engine request ends, whatever happens."""
        d = self.decisions
        if rec.length_bounds is None:  # classed by its length as sent
            rec.length_bounds = self.length_classes.observe(prompt_tokens, time.monotonic())
        if d.truncate_tokens is not None and prompt_tokens > d.truncate_tokens:
            prompt = _truncated(prompt, d.truncate_tokens)
            rec.policy_actions.append(f"truncate:{prompt_tokens}->{d.truncate_tokens}")
            prompt_tokens = d.truncate_tokens
        rec.queued_at = rec.queued_at or time.monotonic()
        target = self.ttft_target(prompt_tokens) if self.ttft_target else None
        lane = lane_of(rec)
        load = self.load.admit(prompt_tokens)
        if rec.load is None:
            rec.load = load
            check = self._deadline_check(rec, lane, load, prompt_tokens, target, d)
            if check is not None and check.action in (F.REFUSE, F.DEFER):
                self.load.release(prompt_tokens)
                rec.prompt_tokens = prompt_tokens  # its row says what was refused
                return self._refuse(rec, check)
            if check is not None and check.action == F.TRUNCATE:
                prompt, prompt_tokens = self._truncate(rec, prompt, prompt_tokens,
                                                       check.truncate_to)
            if check is not None and check.action == F.BEST_EFFORT:
                lane = self._best_effort(rec)
            rec.prediction = self.predictor.predict(
                prompt_tokens, max_tokens, load, rec.priority == R.PRIORITY_BATCH,
                time.monotonic() - rec.arrival, queue_ttft_s=rec.ttft_expected_s)
        try:
            await self.faults.before_engine()
            await self._acquire(rec, lane, target, prompt_tokens, d)
        except LimiterTimeout as exc:
            self.load.release(prompt_tokens)
            return Refusal("admission_timeout", str(exc), d.retry_after_s)
        except LimiterFull as exc:
            self.load.release(prompt_tokens)
            rec.policy_actions.append("reject:queue_full")
            return Refusal("queue_full", str(exc), d.retry_after_s)
        except BaseException:
            self.load.release(prompt_tokens)
            raise
        return Admitted(prompt, prompt_tokens, 0 if d.deadline_margin is None else
                        engine_priority(lane_of(rec), rec.arrival + (target or 0.0), self.epoch))

    def work_ahead(self, lane: str, load: AdmissionLoad, now: float,
                   deadline: float = float("inf"), rank: int = 0,
                   priority: int | None = None, booked: bool = False) -> F.WorkAhead:
        """What stands between a newcomer in `lane` due at `deadline` and its first
        token (`serving.guard.work_ahead`)."""
        return self.ahead.work_ahead(lane, load, now, deadline, rank, priority,
                                     self.decisions.vip_kv_reserve, booked)

    def holds_back(self, lane: str, tokens: int, deadline: float) -> bool:
        """Whether a request of `lane` with a prompt of `tokens`, due at `deadline`,
        must wait in front: it would make a prompt in the engine, due before it, late
        (`slo.policy.promises`; while the deadline check keeps promises; never a VIP)."""
        if lane == LANE_VIP or not self.decisions.keep_promises:
            return False
        now = time.monotonic()
        coming = self.retries.coming(now, deadline)
        held = self.ahead.holds_back(tokens, engine_priority(lane, deadline, self.epoch),
                                     deadline, self.epoch, now, coming)
        if held and coming:  # a retry that never comes releases it by time, not by a step
            self.limiter.wake_at(min(b.deadline for b in coming))
        return held

    def entered(self, prefill: PrefillEnd) -> None:
        self.load.in_engine.add(prefill)

    def left(self, prefill: PrefillEnd) -> None:
        self.load.in_engine.discard(prefill)

    def _deadline_check(self, rec: RequestRecord, lane: str, load: AdmissionLoad,
                        prompt_tokens: int, target: float | None,
                        d: Decisions) -> F.Feasibility | None:
        """The estimate always (it is the queue-aware TTFT prediction); the verdict is
        applied only while the deadline policy is on (None: no target to judge by)."""
        if target is None:
            return None
        now, deadline, model = time.monotonic(), rec.arrival + target, self.engine_model.model
        priority = (None if d.deadline_margin is None
                    else engine_priority(lane, deadline, self.epoch))
        retry = lane != LANE_VIP and self.retries.claim(rec.client, prompt_tokens, now)
        if retry:  # back for its booking: it enters at once, as promised
            rec.policy_actions.append(RETRY_BOOKED)
        base = self.work_ahead(lane, load, now, deadline, self._rank(rec, prompt_tokens, d),
                               priority, retry)
        held = not retry and self.holds_back(lane, prompt_tokens, deadline)
        if held:  # it waits for those ahead, booked retries included
            base = replace(base, shares_steps=False)
        booked = (0, 0)  # refused requests booked to come back before it (not retries)
        if (d.hold_retries or held) and lane != LANE_VIP and not retry:
            booked = self.retries.work_due(now, deadline)
        ahead = base.with_prefill(*booked)
        expected = ahead.at_means()  # the prediction's input: its waits at their means
        if lane == LANE_VIP:
            self.vips.arrived(prompt_tokens, now)
        else:  # VIPs coming before its deadline go ahead of it
            ahead = self.vips.ahead_of(ahead, deadline - now, now, priority is not None)
        check = F.judge(model, prompt_tokens, ahead,
                        deadline - now, vip=rec.vip, truncate_to=d.deadline_truncate_tokens,
                        margin=d.deadline_margin or F.DEFAULT_MARGIN, slowdown=d.slowdown,
                        overloaded=d.refusing_late)
        rec.ttft_estimate_s = now - rec.arrival + check.ttft_s / d.slowdown
        if d.deadline_margin is None and check.action != F.ADMIT:
            check = F.Feasibility(F.ADMIT, check.ttft_s, check.left_s)
        served = check.truncate_to if check.action == F.TRUNCATE else prompt_tokens
        rec.ttft_expected_s = now - rec.arrival + F.first_token_s(model, served, expected)
        if d.slowdown == 1.0 and F.alone(expected, served):  # what calibrates the overhead
            rec.engine_ttft_s = rec.ttft_expected_s - model.overhead_s
        if check.action in (F.REFUSE, F.DEFER):
            return replace(check, retry_after_s=self.retries.book(
                rec.client, prompt_tokens, now,
                F.drain_s(model, base, prompt_tokens) * d.slowdown,
                F.prefill_s(model, prompt_tokens, base.running) * d.slowdown, lane, target))
        return check

    def _refuse(self, rec: RequestRecord, check: F.Feasibility) -> Refusal:
        if check.action == F.DEFER:  # not counted: the policy reads on-time-able refusals
            rec.policy_actions.append("refuse:unattainable")
            return Refusal("unattainable", f"this engine cannot meet the {check.left_s + 0.0:.2f} "
                           f"s first-token target even idle, and it is refusing requests "
                           f"now; retry after {check.retry_after_s} s to be served best "
                           f"effort", check.retry_after_s, status=429)
        self.refused_deadline += 1
        rec.policy_actions.append("refuse:deadline")
        return Refusal("deadline", f"cannot meet the {check.left_s + 0.0:.2f} s left to this "
                       f"request's first-token deadline (first token expected in "
                       f"{check.ttft_s:.2f} s); retry after {check.retry_after_s} s",
                       check.retry_after_s, status=429)

    @staticmethod
    def _best_effort(rec: RequestRecord) -> str:
        """Late even on an idle engine: served in the batch lane, never refused."""
        if rec.priority == R.PRIORITY_REALTIME:
            rec.priority = R.PRIORITY_BATCH
            rec.policy_actions.append("demote:unattainable")
        return R.PRIORITY_BATCH

    def _truncate(self, rec: RequestRecord, prompt, prompt_tokens: int, keep: int):
        self.load.release(prompt_tokens)
        self.load.admit(keep)
        rec.policy_actions.append(f"truncate:{prompt_tokens}->{keep}")
        return _truncated(prompt, keep), keep

    async def _acquire(self, rec: RequestRecord, lane: str, target: float | None,
                       prompt_tokens: int, d: Decisions) -> None:
        began = time.monotonic()
        try:
            await self._wait_in_front(rec, lane, target, prompt_tokens, d, began)
        finally:  # admitted, timed out or gone: the row says how long (the longest of
            # its prompts' waits when a completion sends several)
            rec.admission_wait_s = max(rec.admission_wait_s or 0.0, time.monotonic() - began)

    async def _wait_in_front(self, rec: RequestRecord, lane: str, target: float | None,
                             prompt_tokens: int, d: Decisions, began: float) -> None:
        """While the deadline policy is on, a realtime request waits in its lane only
        as long as its first token can still come in time after it gets a slot; past
        that it moves to the batch lane, and the realtime lane keeps only requests that
        still can."""
        deadline = None if target is None else rec.arrival + target
        rank, booked = self._rank(rec, prompt_tokens, d), RETRY_BOOKED in rec.policy_actions
        if d.deadline_margin is not None and target is not None \
                and lane == R.PRIORITY_REALTIME:
            own = F.prefill_s(self.engine_model.model, prompt_tokens, 0)
            left = target - (began - rec.arrival) - own
            if left < self.limiter.max_wait_s:  # else the wait bound comes first: a 503
                try:
                    return await self.limiter.acquire(lane, left, prompt_tokens, deadline,
                                                      rank, booked)
                except LimiterTimeout:
                    rec.priority = lane = R.PRIORITY_BATCH
                    rec.policy_actions.append("demote:deadline")
        waited = time.monotonic() - began  # one wait bound for the whole wait
        await self.limiter.acquire(lane, max(0.0, self.limiter.max_wait_s - waited),
                                   prompt_tokens, deadline, rank, booked)

    @staticmethod
    def _rank(rec: RequestRecord, prompt_tokens: int, d: Decisions) -> int:
        """Its length class while lanes serve short first (before deadlines), else 0."""
        if not d.length_class_order or rec.length_bounds is None:
            return 0
        return class_of(prompt_tokens, rec.length_bounds)

    def first_token(self, prompt_tokens: int, computed: int = 0) -> None:
        """Its prefill (`prompt_tokens` left after `computed`) is done: not work ahead."""
        self.load.release(prompt_tokens, computed)
        self.limiter.prefilled(prompt_tokens, finished=True)

    def prefill_progress(self, tokens: int, computed: int) -> None:
        """A chunk of `tokens` of a prompt in the engine, `computed` of it before the
        chunk, is prefilled: that much less work ahead."""
        self.load.progress(tokens, computed)
        self.limiter.prefilled(tokens)

    def release(self, pending_tokens: int | None, computed: int = 0,
                kv_tokens: int = 0) -> None:
        """The engine request ended (admitted by `admit`, which took its slot);
        `pending_tokens`: what was left of its prompt (after `computed` of it) if it
        never got a first token, else None; `kv_tokens`: the KV cache it held."""
        if pending_tokens is not None:
            self.load.release(pending_tokens, computed)
        self.limiter.release(pending_tokens, kv_tokens)


def _truncated(prompt, keep: int):
    """Keep the first `keep` prompt tokens (the documented side: a document's start
    usually says what it is; the end is cut)."""
    if isinstance(prompt, dict):
        return {**prompt, "prompt_token_ids": list(prompt["prompt_token_ids"][:keep])}
    prompt.prompt_token_ids = prompt.prompt_token_ids[:keep]
    return prompt
