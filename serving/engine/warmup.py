"""Warm-up before the server says ready (SPEC §1): one prompt per length bucket, twice.

A fresh CPU engine spends seconds on the first prompt of a new size (kernel and
buffer set-up); without warm-up the first users pay it, and a P99 measured over the
first minutes is a start-up artefact. Each length is run twice and the ratio of the
first call to the second is kept and reported (`/readyz`, the log). An engine
restarted by breaker L2 runs each length once (the second call only measures), so it
serves again sooner.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import asdict, dataclass

log = logging.getLogger("tailguard.warmup")
LENGTHS = (64, 256, 512, 1024, 2048)  # plus the longest prompt the context allows


@dataclass(frozen=True, slots=True)
class WarmupCall:
    prompt_tokens: int
    first_s: float
    later_s: float

    @property
    def ratio(self) -> float:
        return self.first_s / self.later_s if self.later_s else float("inf")

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


async def warm_up(engine, max_model_len: int, vocab_size: int, seed: int = 0,
                  measure: bool = True) -> list[WarmupCall]:
    """Run every length that fits the context; returns first/later latencies (with
    `measure=False`, each length runs once and nothing is returned)."""
    from vllm import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
    calls = []
    longest = max_model_len - 8  # a prefill in several chunks has its own first-call cost
    for length in sorted({n for n in LENGTHS if n < longest} | {longest}):
        tokens = [rng.randrange(16, vocab_size) for _ in range(length)]
        first = await _timed(engine, tokens, params)
        if measure:
            later = await _timed(engine, tokens[::-1], params)  # same size, no prefix hit
            calls.append(WarmupCall(length, first, later))
    await _warm_sampler_paths(engine, rng, vocab_size)
    for call in calls:
        log.info("warm-up %5d tokens: first %.3fs, later %.3fs (x%.1f)",
                 call.prompt_tokens, call.first_s, call.later_s, call.ratio)
    return calls


async def _warm_sampler_paths(engine, rng: random.Random, vocab_size: int) -> None:
    """Logprobs and random sampling build their own kernels on first use (a g++ compile
    of tens of seconds on a small CPU unless torch.compile is off, as it is with
    `--enforce-eager`: see serving/engine/setup.py): pay it here, not in a user's
    request, where the engine watchdog would take the silent engine for a hung one."""
    from vllm import SamplingParams

    tokens = [rng.randrange(16, vocab_size) for _ in range(32)]
    for params in (SamplingParams(max_tokens=2, logprobs=5, prompt_logprobs=5, temperature=0),
                   SamplingParams(max_tokens=2, temperature=0.8, top_p=0.9, top_k=20,
                                  min_p=0.05, repetition_penalty=1.1, seed=1, logprobs=2)):
        await _timed(engine, tokens, params)


async def _timed(engine, tokens: list[int], params) -> float:
    start = time.monotonic()
    async for _ in engine.generate({"prompt_token_ids": tokens}, params,
                                   f"warmup-{uuid.uuid4().hex[:8]}"):
        pass
    return time.monotonic() - start


class WarmupGate:
    """Keeps warm-up out of the live windows. Warm-up runs every prompt length back to
    back, so the engine second that holds it reads as a 100%-busy engine (and its long
    prompts as the step time to expect): policies would trip on it at start-up. Steps
    that began before the engine went live (`went_live`) reach only the consumers that
    want them (the engine model, calibrated by every step) and are marked in their
    `llm.step` rows; a restart's warm-up is held back the same way."""

    __slots__ = ("live_from", "_on_live")

    def __init__(self, on_live=lambda: None) -> None:
        self.live_from = float("inf")  # nothing is live before the first warm-up ends
        self._on_live = on_live  # drops what the warm-up left in the live windows

    def warming(self) -> None:
        self.live_from = float("inf")

    def went_live(self, now: float | None = None) -> None:
        self.live_from = time.monotonic() if now is None else now
        self._on_live()

    def is_warmup(self, step) -> bool:
        return step.start < self.live_from

    def live_only(self, consumer):
        """`consumer`, called only with steps that began after the engine went live."""
        def live_step(step) -> None:
            if step.start >= self.live_from:
                consumer(step)
        return live_step

    def marking(self, span_step):
        """`span_step(step, warmup=...)`, told whether the step was warm-up."""
        def step_span(step) -> None:
            span_step(step, warmup=step.start < self.live_from)
        return step_span
