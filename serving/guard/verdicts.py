"""Admission's answers (`serving.admission`): `Admitted`, with what to send the engine,
or `Refusal`, with what to tell the client; the HTTP layer turns a refusal into its
error (`serving.errors`), the engine wrapper sends an admitted prompt
(`serving.engine.observed`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    """Admission's no: why (the row's error type: `shed`, `engine_restarting`,
    `admission_timeout`, `queue_full`, `deadline`), what to tell the client, when it may
    come back, and the HTTP status (503: the server cannot serve now; 429: this request
    cannot be served in time now, come back later)."""

    reason: str
    message: str
    retry_after_s: int
    status: int = 503


@dataclass(frozen=True, slots=True)
class Admitted:
    """Admission's yes: the prompt to send (maybe truncated), its length, its engine
    priority (`engine_priority`; 0 while the deadline policy is off: arrival order)."""

    prompt: object
    prompt_tokens: int
    priority: int = 0


def shed_refusal(policy: str, retry_after_s: int) -> Refusal:
    return Refusal("shed", f"overloaded: request shed by the {policy} policy; retry after "
                   f"{retry_after_s} s", retry_after_s)
