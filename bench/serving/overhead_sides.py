"""The four sides the overhead benchmark compares, as batch runners: the same prompts
sent as bare `AsyncLLM.generate()` calls ("off", "on", "bare") or through the full
observation path ("observed"), and a side-turn of back-to-back batches."""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from loadgen.report import percentile

SIDES = ("off", "on", "bare", "observed")
FIRST_TOKEN_ID = 3  # skip the special tokens at the start of the embedded vocab


def prompt_lengths(args) -> list[int]:
    rng = random.Random(args.seed)
    return [rng.randint(args.prompt_min, args.prompt_max) for _ in range(args.concurrency)]


def make_prompts(args, batch_index: int, vocab: int) -> list[list[int]]:
    """Fresh random token ids every batch (the prefix cache never hits), the same
    lengths every batch."""
    rng = random.Random(args.seed * 1_000_003 + batch_index)
    return [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]
            for n in prompt_lengths(args)]


async def _generate(engine, prompt, params, request_id: str) -> tuple[float | None, int]:
    """One request, the same loop on both sides: (first-token time, output tokens)."""
    first, n = None, 0
    async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id):
        n = len(out.outputs[0].token_ids)
        if n and first is None:
            first = time.monotonic()
    return first, n


async def batch_bare(engine, prompts, params) -> dict:
    """N concurrent bare `AsyncLLM.generate()` calls."""
    t0 = time.monotonic()

    async def one(prompt) -> tuple[float, int]:
        first, n = await _generate(engine, prompt, params, f"cmpl-{uuid.uuid4().hex}-0")
        return first - t0, n

    results = await asyncio.gather(*(one(p) for p in prompts))
    return {"wall_s": time.monotonic() - t0, "ttfts": [r[0] for r in results],
            "tokens": sum(r[1] for r in results)}


async def batch_observed(runtime, prompts, params, cpu: dict) -> dict:
    """The same calls through the full observation path (what serving/generation.py
    does around vLLM's serving handler, minus HTTP and vLLM's OpenAI layer)."""
    from serving.engine.observed import current_request

    begin, finish = cpu["begin"].wrap(runtime.observer.begin), \
        cpu["finish"].wrap(runtime.observer.finish)
    engine, model_name = runtime.handle.engine, runtime.config.model_name
    t0 = time.monotonic()

    async def one(prompt) -> tuple:
        rec, span = begin("text_completion", {})
        current_request.set(rec)  # each gather() task runs in its own context copy
        rec.model = model_name
        first, n = await _generate(engine, prompt, params, f"cmpl-{rec.request_id}-0")
        finish(rec, span)
        # every generated token needs a step: fewer credited steps = lost datagrams
        return first - t0, n, rec.status != "ok", rec.tally.steps >= n

    results = await asyncio.gather(*(one(p) for p in prompts))
    return {"wall_s": time.monotonic() - t0, "ttfts": [r[0] for r in results],
            "tokens": sum(r[1] for r in results), "not_ok": sum(r[2] for r in results),
            "probe_credited": sum(r[3] for r in results)}


async def side_turn(run, make_prompts_fn, batches: int) -> dict:
    """`batches` back-to-back batches -> tokens/s over their summed wall time and TTFT
    percentiles over all their requests."""
    parts = [await run(make_prompts_fn()) for _ in range(batches)]
    wall = sum(p["wall_s"] for p in parts)
    ttfts = [t for p in parts for t in p["ttfts"]]
    tokens = sum(p["tokens"] for p in parts)
    out = {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "requests": len(ttfts),
           "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99)}
    for key in ("not_ok", "probe_credited"):
        if key in parts[0]:
            out[key] = sum(p[key] for p in parts)
    return out
