"""The engine's dtype on CPU: float32 where bfloat16 would be emulated (an x86 CPU
without AVX512-BF16 or AMX), vLLM's default elsewhere, and always the operator's
choice when one is given."""

from __future__ import annotations

import pytest

from serving.engine.setup import cpu_dtype_flags, vllm_namespace, x86_cpu_flags

AVX2 = {"fpu", "sse2", "avx", "avx2", "fma"}
AVX512_BF16 = AVX2 | {"avx512f", "avx512_bf16"}
SAPPHIRE_RAPIDS = AVX2 | {"avx512f", "amx_bf16", "amx_tile"}


@pytest.mark.parametrize("flags,extra,expected", [
    (AVX2, [], ("--dtype", "float32")),
    (AVX512_BF16, [], ()),
    (SAPPHIRE_RAPIDS, [], ()),
    (set(), [], ()),  # not x86: flags unknown, vLLM decides
    (AVX2, ["--dtype", "bfloat16"], ()),  # the operator's choice wins
    (AVX2, ["--dtype=float16"], ()),
])
def test_dtype_follows_the_cpu_unless_chosen(flags, extra, expected):
    assert cpu_dtype_flags(extra, flags) == expected


def test_this_machines_flags_are_read_from_cpuinfo():
    flags = x86_cpu_flags()
    with open("/proc/cpuinfo") as info:
        listed = [line for line in info if line.startswith("flags")]
    assert (flags and flags == set(listed[0].split(":", 1)[1].split())) or not listed


def test_vllm_parses_the_chosen_dtype():
    args = vllm_namespace("some/model", None, [])
    expected = "float32" if cpu_dtype_flags([]) else "auto"
    assert args.dtype == expected
    assert vllm_namespace("some/model", None, ["--dtype", "bfloat16"]).dtype == "bfloat16"


@pytest.mark.parametrize("extra, expected", [
    ([], "priority"),  # admission's order (lane, then deadline) holds inside the engine
    (["--scheduling-policy", "fcfs"], "fcfs"),  # the operator's choice wins
    (["--scheduling-policy=fcfs"], "fcfs"),
])
def test_the_engine_schedules_by_priority_unless_chosen(extra, expected):
    assert vllm_namespace("some/model", None, extra).scheduling_policy == expected


@pytest.mark.parametrize("extra, threshold, adaptive", [
    ([], 256, True),  # the adaptive cap: a busy engine's steps hold 256-token chunks
    (["--long-prefill-token-threshold", "0"], 0, False),  # off
    (["--long-prefill-token-threshold=512"], 512, False),  # the operator's threshold
    (["--no-long-prefill-token-threshold-adaptive"], 256, False),  # a fixed cap
])
def test_the_engine_caps_prefill_chunks_adaptively_unless_chosen(extra, threshold, adaptive):
    args = vllm_namespace("some/model", None, extra)
    assert (args.long_prefill_token_threshold, args.long_prefill_token_threshold_adaptive) \
        == (threshold, adaptive)
