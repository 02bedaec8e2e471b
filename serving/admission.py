"""Admission: what happens to a request between the HTTP layer and the engine.

Two points, because what is known grows on the way in:
- `check_http` (body parsed, not tokenized): the engine restarting, shedding
  non-VIP load, the max_tokens cap;
- `admit` (tokenized, just before the engine): the load it meets and its predicted
  latency, truncation, the predicted-miss lane change or shed, then the concurrency
  limiter (realtime lane before batch) and any injected fault.
Each decision lands in the record's `policy_actions` (its span and row); a refusal
comes back as a `Refusal` value, which the HTTP layer answers (`serving.errors`).
The policy loop hands admission its decisions through `publish()`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from observe import registry as R
from observe.record import RequestRecord
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.guard.live_predictor import PredictionService
from serving.limiter import Limiter, LimiterTimeout
from slo.policy.decisions import Decisions


@dataclass(frozen=True, slots=True)
class Refusal:
    """Admission's no: why (the row's error type: `shed`, `engine_restarting`,
    `admission_timeout`), what to tell the client, and when it may come back."""

    reason: str
    message: str
    retry_after_s: int


@dataclass(frozen=True, slots=True)
class Admitted:
    """Admission's yes: the prompt to send (maybe truncated) and its length. The engine
    request now holds a slot until `Admission.release()`."""

    prompt: object
    prompt_tokens: int


def _shed(policy: str, retry_after_s: int) -> Refusal:
    return Refusal("shed", f"overloaded: request shed by the {policy} policy; retry after "
                   f"{retry_after_s} s", retry_after_s)


class Admission:
    def __init__(self, load: LoadTracker, predictor: PredictionService, limiter: Limiter,
                 faults: FaultInjector, ttft_target=None):
        self.load = load
        self.predictor = predictor
        self.limiter = limiter
        self.faults = faults
        self.ttft_target = ttft_target  # prompt tokens -> TTFT target s, or None
        self.decisions = Decisions(concurrency_limit=limiter.limit)

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
            return _shed(d.shed_non_vip, d.retry_after_s)
        if d.max_tokens_cap is not None:
            for field in ("max_tokens", "max_completion_tokens"):
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
        if d.truncate_tokens is not None and prompt_tokens > d.truncate_tokens:
            prompt = _truncated(prompt, d.truncate_tokens)
            rec.policy_actions.append(f"truncate:{prompt_tokens}->{d.truncate_tokens}")
            prompt_tokens = d.truncate_tokens
        rec.queued_at = rec.queued_at or time.monotonic()
        target = self.ttft_target(prompt_tokens) if self.ttft_target else None
        load = self.load.admit(prompt_tokens)
        if rec.load is None:
            rec.load = load
            rec.prediction = self.predictor.predict(
                prompt_tokens, max_tokens, load, rec.priority == R.PRIORITY_BATCH,
                time.monotonic() - rec.arrival)
            refusal = self._predicted_miss(rec, prompt_tokens, target, d)
            if refusal is not None:
                return refusal
        try:
            await self.faults.before_engine()
            await self._acquire(rec, target, d)
        except LimiterTimeout as exc:
            self.load.release(prompt_tokens)
            return Refusal("admission_timeout", str(exc), d.retry_after_s)
        except BaseException:
            self.load.release(prompt_tokens)
            raise
        return Admitted(prompt, prompt_tokens)

    def _predicted_miss(self, rec: RequestRecord, prompt_tokens: int, target: float | None,
                        d: Decisions) -> Refusal | None:
        """Under overload, a request predicted to miss its TTFT target by far moves to
        the batch lane (realtime) or is shed (batch): it would only take a slot from
        one that can still make it."""
        if d.predicted_miss_factor is None or target is None:
            return None
        if rec.prediction.ttft_s <= target * d.predicted_miss_factor:
            return None
        if rec.priority == R.PRIORITY_REALTIME:
            rec.priority = R.PRIORITY_BATCH
            rec.policy_actions.append("demote:predicted_miss")
            return None
        self.load.release(prompt_tokens)
        rec.policy_actions.append("shed:predicted_miss")
        return _shed("predicted_miss", d.retry_after_s)

    async def _acquire(self, rec: RequestRecord, target: float | None, d: Decisions) -> None:
        """Under overload (the predicted-miss policy on) a realtime request waits in the
        realtime lane only until its TTFT target has passed; by then it cannot meet it,
        so it moves to the batch lane and the realtime lane keeps only requests that
        still can."""
        if (d.predicted_miss_factor is not None and target is not None
                and rec.priority == R.PRIORITY_REALTIME):
            left = target - (time.monotonic() - rec.arrival)
            try:
                await self.limiter.acquire(R.PRIORITY_REALTIME, max(0.0, left))
                return
            except LimiterTimeout:
                rec.priority = R.PRIORITY_BATCH
                rec.policy_actions.append("demote:deadline")
        await self.limiter.acquire(rec.priority)

    def first_token(self, prompt_tokens: int) -> None:
        """Its prefill is done: no longer work ahead of newcomers."""
        self.load.release(prompt_tokens)

    def release(self, prompt_tokens: int, pending: bool) -> None:
        """The engine request ended (admitted by `admit`, which took its slot);
        `pending`: it never got a first token."""
        if pending:
            self.load.release(prompt_tokens)
        self.limiter.release()


def _truncated(prompt, keep: int):
    """Keep the first `keep` prompt tokens (the documented side: a document's start
    usually says what it is; the end is cut)."""
    if isinstance(prompt, dict):
        return {**prompt, "prompt_token_ids": list(prompt["prompt_token_ids"][:keep])}
    prompt.prompt_token_ids = prompt.prompt_token_ids[:keep]
    return prompt
