"""What vLLM's engine outputs tell the request's record: the prompt length of what
vLLM hands the engine, whether its outputs are deltas, and one engine request's
outcome added to the record (`ObservedEngine`'s pump calls these)."""

from __future__ import annotations

from dataclasses import replace

from observe.record import RequestRecord
from observe.stats import EngineTimes, WallClock


def prompt_length(prompt) -> int:
    """Prompt tokens of what vLLM's serving classes hand the engine: a tokenized
    prompt dict (or an `EngineCoreRequest`); 0 when it is not tokenized yet."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(
        prompt, "prompt_token_ids", None)
    return len(ids) if ids is not None else 0


def is_delta(sampling_params) -> bool:
    """Streaming asks vLLM for deltas: token counts must then be summed."""
    kind = getattr(sampling_params, "output_kind", None)
    return getattr(kind, "name", "") == "DELTA"


def absorb(rec: RequestRecord, out, output_tokens: int, clock: WallClock) -> None:
    """Add one engine request's outcome to the record (a completion with several
    prompts makes several engine requests)."""
    rec.prompt_tokens += len(out.prompt_token_ids or ())
    rec.output_tokens += output_tokens
    reasons = [o.finish_reason for o in out.outputs if o.finish_reason]
    if reasons:
        rec.finish_reason = reasons[0]
    times = EngineTimes.from_vllm(out.metrics, clock)
    if times is not None and rec.queued_at is not None and times.accepted is not None:
        # waiting for an engine slot (the concurrency limit) is queueing too
        times = replace(times, accepted=min(times.accepted, rec.queued_at))
    if times is not None:
        rec.engine = times if rec.engine is None else rec.engine.merge(times)
