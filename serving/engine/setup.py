"""Building the vLLM engine exactly as `vllm serve` would: vLLM's own argument parser
(so every engine argument passes through, `tailguard serve -- --tensor-parallel-size
2`), CPU-friendly defaults, then `AsyncLLM` with our stat loggers.

Two things make an engine restart (breaker L2) fast on CPU, where vLLM spawns each
engine process as a fresh interpreter that imports torch and vLLM (7-8 s of CPU each
on a small box, twice: the engine core, then its worker):

- the engine core is forked from a fork server that imported vLLM once, when the
  first engine started; the worker is still spawned (its OpenMP thread binding comes
  from environment variables read when torch loads, so it needs a fresh interpreter);
- with `--enforce-eager` (our default) nothing is `torch.compile`d: vLLM still
  compiles two sampler helpers (logprobs, random sampling) on first use, seconds even
  from the on-disk cache and tens of seconds without one, for no speed-up on CPU.
"""

from __future__ import annotations

import multiprocessing
from argparse import Namespace

from observe import settings
from observe.settings import (
    TORCH_COMPILE_DISABLE,
    VLLM_CPU_KVCACHE_SPACE,
    VLLM_WORKER_MULTIPROC_METHOD,
)
from serving.engine.allocator import set_engine_env_defaults

# Defaults that make a CPU box start in seconds; every one can be overridden by
# passing the vLLM flag explicitly.
CPU_ENV_DEFAULTS = {VLLM_CPU_KVCACHE_SPACE: "1"}
DEFAULT_VLLM_FLAGS = ("--enforce-eager", "--distributed-executor-backend", "uni")
# vLLM's priority scheduling, so admission's order (lane, then deadline) holds inside the
# engine too (`slo.sim.lanes.engine_priority`); `--scheduling-policy fcfs` keeps vLLM's.
DEFAULT_SCHEDULING = ("--scheduling-policy", "priority")
# Under priorities, vLLM's scheduler with VIP prompts first (`serving.guard.vip_first`),
# the async one where vLLM chose async scheduling; an operator's `--scheduler-cls` wins.
VIP_FIRST_SCHEDULERS = {False: "serving.guard.vip_first.VipFirstScheduler",
                        True: "serving.guard.vip_first.VipFirstAsyncScheduler"}
# vLLM's per-request prefill chunk cap, adaptive: while the engine is busy no prompt
# takes more than 256 tokens of a step (so a short, urgent prompt is not held behind a
# document's whole chunk), but never less than the step's fair share among the requests
# in the engine, and none alone (light load keeps whole-budget chunks). Chosen and
# measured in docs/benchmarks.md ("A prefill chunk cap under load");
# `--long-prefill-token-threshold 0` turns it off.
DEFAULT_PREFILL_CAP = ("--long-prefill-token-threshold", "256",
                       "--long-prefill-token-threshold-adaptive")
# With --enforce-eager: torch.compile off in the engine processes too (an operator's
# value wins).
EAGER_ENV_DEFAULTS = {TORCH_COMPILE_DISABLE: "1"}
# What the engine-core fork server imports once (what a spawned engine core imports).
FORKSERVER_PRELOAD = ("vllm.v1.engine.core",)


def vllm_namespace(model: str, served_name: str | None, extra: list[str]) -> Namespace:
    """vLLM's `serve` arguments, parsed by vLLM's own parser."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model, *[f for f in DEFAULT_VLLM_FLAGS if f not in extra],
            *cpu_dtype_flags(extra), *scheduling_flags(extra)]
    if served_name:
        argv += ["--served-model-name", served_name]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv + list(extra))
    args.disable_log_stats = False  # per-request timing needs the engine's stats
    return args


def _chosen(extra: list[str], flag: str) -> bool:
    """Whether the operator's flags set `flag` (`--flag V` or `--flag=V`)."""
    return any(f == flag or f.startswith(flag + "=") for f in extra)


def scheduling_flags(extra: list[str]) -> tuple[str, ...]:
    """`--scheduling-policy priority` unless the operator chose a policy, and the
    adaptive prefill chunk cap unless they chose a threshold (their flags come after
    these, so `--no-long-prefill-token-threshold-adaptive` wins too)."""
    policy = () if _chosen(extra, "--scheduling-policy") else DEFAULT_SCHEDULING
    cap = () if _chosen(extra, "--long-prefill-token-threshold") else DEFAULT_PREFILL_CAP
    return (*policy, *cap)


def choose_scheduler(scheduler_config) -> None:
    """Under priorities, unless the operator chose a scheduler class, the VIP-first
    scheduler, built on the one vLLM chose (async scheduling or not: a subclass of the
    other would give that up)."""
    if scheduler_config.policy == "priority" and scheduler_config.scheduler_cls is None:
        scheduler_config.scheduler_cls = \
            VIP_FIRST_SCHEDULERS[bool(scheduler_config.async_scheduling)]


def cpu_dtype_flags(extra: list[str], cpu_flags: set[str] | None = None) -> tuple[str, ...]:
    """`--dtype float32` on an x86 CPU without bfloat16 arithmetic (neither AVX512-BF16
    nor AMX), unless the operator chose a dtype: vLLM's CPU default, bfloat16, is then
    emulated and ~4x slower than float32 (a 512-token prefill of the embedded model:
    0.47-0.59 s against 0.13 s on an AVX2-only EPYC; docs/benchmarks.md)."""
    if _chosen(extra, "--dtype"):
        return ()
    if cpu_flags is None:
        if not _engine_runs_on_cpu():
            return ()
        cpu_flags = x86_cpu_flags()
    if not cpu_flags or cpu_flags & {"avx512_bf16", "amx_bf16"}:
        return ()  # not x86 (flags unknown), or bfloat16 in hardware: vLLM's default
    return ("--dtype", "float32")


def x86_cpu_flags() -> set[str]:
    """The `flags` of /proc/cpuinfo (empty where there is none: not x86 Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _engine_runs_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def start_engine(args: Namespace, stat_loggers: list) -> object:
    """Create the `AsyncLLM` (its engine core runs in a child process)."""
    # vLLM's CPU platform lets this legacy variable override an explicit
    # --kv-cache-memory-bytes, so it is only a default when that flag is absent.
    if getattr(args, "kv_cache_memory_bytes", None) is None:
        settings.set_defaults(CPU_ENV_DEFAULTS)
    if getattr(args, "enforce_eager", False):
        settings.set_defaults(EAGER_ENV_DEFAULTS)
    set_engine_env_defaults()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    choose_scheduler(config.scheduler_config)
    _fork_engine_core(config)
    return AsyncLLM.from_vllm_config(
        config, usage_context=UsageContext.OPENAI_API_SERVER, stat_loggers=stat_loggers,
        disable_log_stats=False, enable_log_requests=engine_args.enable_log_requests)


def _fork_engine_core(config) -> None:
    """Start engine cores from a fork server where vLLM would spawn them (its CPU
    platform asks for spawn; a NUMA-bound or data-parallel engine keeps vLLM's way).
    The server is started, and imports vLLM, when the first engine core starts; it
    lives as long as this process."""
    from vllm.v1.engine import utils as engine_utils

    parallel = config.parallel_config
    if (settings.get(VLLM_WORKER_MULTIPROC_METHOD) != "spawn" or parallel.numa_bind
            or parallel.data_parallel_size > 1):
        return
    vllm_context = getattr(engine_utils.get_mp_context, "vllm_context",
                           engine_utils.get_mp_context)

    def forkserver_context():
        vllm_context()  # vLLM's own checks and environment set-up
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        return EnvCarryingContext(context)

    forkserver_context.vllm_context = vllm_context
    engine_utils.get_mp_context = forkserver_context


class EnvCarryingContext:
    """A fork-server context whose processes start with this process's environment as
    it is when each one starts, as a spawned process would. A forked child otherwise
    inherits the fork server's environment, frozen when the first engine started: a
    variable set later (the step socket of a second engine, an operator's change
    before a restart) would never reach a restarted engine core."""

    __slots__ = ("_context",)

    def __init__(self, context):
        self._context = context

    def Process(self, *args, target=None, kwargs=None, **process_kwargs):  # noqa: N802
        carried = {"environ": settings.snapshot(), "target": target, "kwargs": kwargs or {}}
        return self._context.Process(*args, target=run_with_environ, kwargs=carried,
                                     **process_kwargs)

    def __getattr__(self, name):
        return getattr(self._context, name)


def run_with_environ(environ: dict, target, kwargs: dict):
    """Runs in the forked child: take the parent's environment, then the target."""
    _prepare_process_title()
    settings.replace_all(environ)
    return target(**kwargs)


def _prepare_process_title() -> None:
    """vLLM names its engine core with setproctitle (`VLLM::EngineCore`), which
    claims the memory of argv and the environment the first time it is used. Once
    the environment has been changed it can no longer, and the process stays
    `python` in ps, top and py-spy, where operators look for it. So claim it first."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()
