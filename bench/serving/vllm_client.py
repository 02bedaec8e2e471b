"""vLLM's own benchmark client (`vllm bench serve`), run in this process against one
server: its argument parser, its random dataset, its request generator and its
percentile arithmetic, so the numbers are the ones a vLLM user would get.

Two workloads:
- light: streamed completions, prompts of 100-1,900 tokens (random, 1,000 +- 90%) and
  3-60 output tokens, Poisson arrivals at `rate` req/s;
- saturate: a closed loop of `concurrency` clients, 300-token prompts, 16 output tokens
  (the issue's short requests), as fast as the server answers.

Every output is ignore-EOS (lengths as asked). Request ids are `prefix + index`, so a
server that logs them (tailguard's trace log) can be joined with the client's view.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    input_len: int
    output_len: int
    range_ratio: float
    prompts: int
    rate: float  # req/s, inf: closed loop
    concurrency: int | None


def light(rate: float, prompts: int) -> Workload:
    return Workload("light", 1000, 32, 0.9, prompts, rate, None)


def saturate(concurrency: int, prompts: int) -> Workload:
    return Workload("saturate", 300, 16, 0.0, prompts, float("inf"), concurrency)


def process_cpu_s(pid: int) -> float:
    """utime + stime of every thread of the process (not its children)."""
    return stat_cpu_s(f"/proc/{pid}/stat")


def children_cpu_s(pid: int) -> float:
    """cutime + cstime: the CPU of the process's children it has waited for."""
    return stat_cpu_s(f"/proc/{pid}/stat", reaped_children=True)


def stat_cpu_s(path: str, reaped_children: bool = False) -> float:
    """utime + stime from a /proc stat file: a process's, or one thread's
    (/proc/PID/task/TID/stat); cutime + cstime with `reaped_children`. OSError when
    it has gone."""
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    first = 13 if reaped_children else 11  # after ")": utime is field 11, cutime 13
    return (int(fields[first]) + int(fields[first + 1])) / CLOCK_TICKS


def client_args(url: str, model: str, tokenizer: str, work: Workload, seed: int,
                prefix: str) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(work.input_len),
            "--random-output-len", str(work.output_len),
            "--random-range-ratio", str(work.range_ratio), "--num-prompts", str(work.prompts),
            "--request-rate", str(work.rate), "--seed", str(seed), "--ignore-eos",
            "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--save-detailed", "--request-id-prefix", prefix,
            "--ready-check-timeout-sec", "0", "--num-warmups", "0"]
    if work.concurrency:
        argv += ["--max-concurrency", str(work.concurrency)]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args(argv)


def run(url: str, pid: int, model: str, tokenizer: str, work: Workload, seed: int,
        prefix: str, settle: Callable[[], object] | None = None) -> dict:
    """One run of vLLM's client; the server process's CPU seconds around it, `settle()`
    included: work the server defers past the run (tailguard's trace-log load, once a
    minute) is done inside the count instead of in a later run's, or in none."""
    from vllm.benchmarks.serve import main_async

    args = client_args(url, model, tokenizer, work, seed, prefix)
    cpu = process_cpu_s(pid)
    with contextlib.redirect_stdout(io.StringIO()):  # its report: we print our own
        result = asyncio.run(main_async(args))
    if settle is not None:
        settle()
    cpu = process_cpu_s(pid) - cpu
    completed = result["completed"]
    return {
        "completed": completed, "failed": result.get("failed", 0),
        "output_tok_s": result["output_throughput"],
        "req_s": result["request_throughput"],
        "cpu_ms": 1000 * cpu / completed if completed else None,
        **{f"{m}_{p}": result[f"p{p}_{m}_ms"] / 1000 for m in ("ttft", "tpot", "e2el")
           for p in (50, 99)},
        "latencies": result.get("latencies", []),
    }
