"""Building the vLLM engine exactly as `vllm serve` would: vLLM's own argument parser
(so every engine argument passes through, `tailguard serve -- --tensor-parallel-size
2`), CPU-friendly defaults, then `AsyncLLM` with our stat loggers."""

from __future__ import annotations

import os
from argparse import Namespace

from serving.allocator import set_engine_env_defaults

# Defaults that make a CPU box start in seconds; every one can be overridden by
# passing the vLLM flag explicitly.
CPU_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}
DEFAULT_VLLM_FLAGS = ("--enforce-eager", "--distributed-executor-backend", "uni")


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
    set_engine_env_defaults()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return AsyncLLM.from_vllm_config(
        config, usage_context=UsageContext.OPENAI_API_SERVER, stat_loggers=stat_loggers,
        disable_log_stats=False, enable_log_requests=engine_args.enable_log_requests)
