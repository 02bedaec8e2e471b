"""The vLLM engine, in-process (`AsyncLLM`), and the client wrapper that observes it.

We build the engine exactly as `vllm serve` would, from vLLM's own argument parser,
so every engine argument passes through (`tailguard serve -- --tensor-parallel-size 2`).
vLLM's OpenAI serving classes then run on `ObservedEngine`, which only watches
`generate()`: the wire format stays vLLM's, byte for byte.
"""

from __future__ import annotations

import contextvars
import os
import time
from argparse import Namespace
from collections.abc import AsyncIterator
from dataclasses import replace

from observe.stats import EngineTimes, RequestRecord, WallClock
from serving.steps import StepLedger

# Defaults that make a CPU box start in seconds; every one can be overridden by
# passing the vLLM flag explicitly.
CPU_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}
DEFAULT_VLLM_FLAGS = ("--enforce-eager", "--distributed-executor-backend", "uni")

# The request being served on this task; set by the HTTP layer, read by generate().
current_request: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "tailguard_request", default=None)


def vllm_namespace(model: str, served_name: str | None, extra: list[str]) -> Namespace:
    """vLLM's `serve` arguments, parsed by vLLM's own parser."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model, *[f for f in DEFAULT_VLLM_FLAGS if f not in extra]]
    if served_name:
        argv += ["--served-model-name", served_name]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv + list(extra))
    args.disable_log_stats = False  # per-request timing needs the engine's stats
    return args


def start_engine(args: Namespace, stat_loggers: list) -> object:
    """Create the `AsyncLLM` (its engine core runs in a child process)."""
    # vLLM's CPU platform lets this legacy variable override an explicit
    # --kv-cache-memory-bytes, so it is only a default when that flag is absent.
    if getattr(args, "kv_cache_memory_bytes", None) is None:
        for key, value in CPU_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return AsyncLLM.from_vllm_config(
        config, usage_context=UsageContext.OPENAI_API_SERVER, stat_loggers=stat_loggers,
        disable_log_stats=False, enable_log_requests=engine_args.enable_log_requests)


class ObservedEngine:
    """Delegates to an `AsyncLLM`; `generate()` also fills the current request's
    record: token counts, finish reason, first-token time and the engine's stamps."""

    def __init__(self, engine, ledger: StepLedger, clock: WallClock, admission=None):
        self._engine = engine
        self._ledger = ledger
        self._clock = clock
        self._admission = admission

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def generate(self, prompt, sampling_params, request_id: str,
                       *args, **kwargs) -> AsyncIterator:
        rec = current_request.get()
        if rec is None:
            async for out in self._engine.generate(prompt, sampling_params, request_id,
                                                   *args, **kwargs):
                yield out
            return
        rec.max_tokens = getattr(sampling_params, "max_tokens", rec.max_tokens)
        prompt_tokens = _prompt_length(prompt)
        admission = self._admission
        if admission is not None:  # may wait for a slot, truncate, or refuse
            prompt, prompt_tokens = await admission.admit(rec, prompt, prompt_tokens,
                                                          rec.max_tokens)
        self._ledger.track(request_id, rec.tally, rec.request_id)
        deltas = _is_delta(sampling_params)
        last, tokens, pending = None, 0, admission is not None
        try:
            async for last in self._engine.generate(prompt, sampling_params, request_id,
                                                    *args, **kwargs):
                new = sum(len(o.token_ids) for o in last.outputs)
                if new and rec.first_token is None:
                    rec.first_token = time.monotonic()
                if new and pending:
                    pending = False
                    admission.first_token(prompt_tokens)
                tokens = tokens + new if deltas else new
                yield last
        finally:
            if admission is not None:
                admission.release(prompt_tokens, pending)
            self._ledger.untrack(request_id)  # drains: every step of this request is in
            if last is not None:
                _absorb(rec, last, tokens, self._clock)


def _prompt_length(prompt) -> int:
    """Prompt tokens of what vLLM's serving classes hand the engine: a tokenized
    prompt dict (or an `EngineCoreRequest`); 0 when it is not tokenized yet."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(
        prompt, "prompt_token_ids", None)
    return len(ids) if ids is not None else 0


def _is_delta(sampling_params) -> bool:
    """Streaming asks vLLM for deltas: token counts must then be summed."""
    kind = getattr(sampling_params, "output_kind", None)
    return getattr(kind, "name", "") == "DELTA"


def _absorb(rec: RequestRecord, out, output_tokens: int, clock: WallClock) -> None:
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
