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
