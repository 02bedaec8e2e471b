"""The VIP-first scheduler on vLLM's own scheduler (its real KV-cache manager and
priority queue, the embedded model's config): which requests each step schedules,
against what vLLM's scheduler schedules for the same requests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from serving.engine.embedded_model import ensure_model  # noqa: E402
from serving.engine.setup import choose_scheduler  # noqa: E402
from serving.guard.vip_first import (  # noqa: E402
    VipFirstAsyncScheduler,
    VipFirstScheduler,
    vip_prefills,
)
from slo.sim.lanes import LANE_PRIORITY_STEP  # noqa: E402

BLOCK = 16
REALTIME = LANE_PRIORITY_STEP + 500  # a realtime request due 0.5 s after the epoch
VIP = 300


def scheduler(cls, blocks: int = 400):
    model = ModelConfig(model=str(ensure_model()), dtype="float32", max_model_len=4096, seed=0)
    config = VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(
            max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=4096,
            long_prefill_token_threshold=256, long_prefill_token_threshold_adaptive=True,
            policy="priority", is_encoder_decoder=False, enable_chunked_prefill=True),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False))
    config.cache_config.num_gpu_blocks = blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return cls(vllm_config=config, kv_cache_config=kv,
               structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)


def add(sched, name: str, tokens: int, priority: int, max_tokens: int = 8) -> None:
    sched.add_request(Request(name, list(range(tokens)), SamplingParams(max_tokens=max_tokens),
                              None, priority=priority))


def step(sched) -> dict[str, int]:
    """One engine step: what was scheduled; each request that reached its prompt's end
    samples token 7 (the model runner's output, as the engine core feeds it back)."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = [[7] if sched.requests[i].num_computed_tokens >= sched.requests[i].num_tokens
               else [] for i in ids]
    sched.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
        sampled_token_ids=sampled))
    return dict(out.num_scheduled_tokens)


def test_a_vip_prompt_takes_the_step_beside_prefilling_and_decoding_requests():
    plain, first = scheduler(Scheduler), scheduler(VipFirstScheduler)
    for sched in (plain, first):
        add(sched, "chat", 100, REALTIME)
        step(sched)  # the chat prompt prefilled: decoding from here on
        for i in range(3):
            add(sched, f"doc{i}", 1500, REALTIME + 1 + i)
        step(sched)
        add(sched, "vip", 900, VIP)
    assert step(plain) == {"chat": 1, "doc0": 409, "doc1": 409, "doc2": 409, "vip": 409}
    assert step(first) == {"chat": 1, "vip": 900}  # whole, uncapped; the documents wait
    assert step(first) == {"chat": 1, "vip": 1, "doc0": 409, "doc1": 409, "doc2": 409}
    assert [r.request_id for r in first.running] == ["chat", "doc0", "doc1", "doc2", "vip"]


def test_several_vip_prompts_share_the_steps_under_the_cap():
    """A VIP document does not take whole steps while a short VIP waits behind it."""
    sched = scheduler(VipFirstScheduler)
    add(sched, "doc", 3000, REALTIME)
    step(sched)
    add(sched, "vip-doc", 3000, VIP + 500)
    add(sched, "vip-chat", 300, VIP)
    # the realtime document held, two in the step: the cap is a fair share, 1,024
    assert step(sched) == {"vip-chat": 300, "vip-doc": 1024}
    assert step(sched) == {"vip-chat": 1, "vip-doc": 1976}  # the lone VIP prompt: uncapped


def test_a_vip_already_prefilling_keeps_the_steps_until_its_first_token():
    sched = scheduler(VipFirstScheduler)
    add(sched, "doc", 4000, REALTIME)
    assert step(sched) == {"doc": 2048}  # alone: the whole budget
    add(sched, "vip", 3000, VIP)  # more than one step's budget
    assert step(sched) == {"vip": 2048}
    assert step(sched) == {"vip": 952}
    assert step(sched) == {"doc": 1024, "vip": 1}  # the cap again: a fair share of two


def test_without_a_vip_or_with_every_priority_equal_it_is_vllms_schedule():
    for priorities in ((REALTIME, REALTIME + 1, REALTIME + 2), (0, 0, 0)):
        plain, first = scheduler(Scheduler), scheduler(VipFirstScheduler)
        for sched in (plain, first):
            for i, priority in enumerate(priorities):
                add(sched, f"r{i}", 700 + 300 * i, priority)
        for _ in range(6):
            assert step(first) == step(plain)


def test_a_vip_that_does_not_fit_the_free_cache_holds_nobody_back():
    plain, first = scheduler(Scheduler, blocks=130), scheduler(VipFirstScheduler, blocks=130)
    for sched in (plain, first):
        add(sched, "doc", 1800, REALTIME)
        step(sched)
        add(sched, "vip", 1200, VIP)  # 130 blocks hold 2,080 tokens: no room for it yet
    assert step(first) == step(plain)


def test_the_vip_tokens_counted():
    class R:
        def __init__(self, priority, tokens, computed):
            self.priority, self.num_tokens, self.num_computed_tokens = priority, tokens, computed
    running = [R(REALTIME, 900, 300), R(VIP, 500, 200), R(VIP, 101, 100)]  # the last decodes
    waiting = [R(VIP, 400, 0), R(VIP, 2000, 0), R(REALTIME, 50, 0)]
    assert vip_prefills(running, waiting, free_tokens=1000) == (2, 300 + 400)
    assert vip_prefills(running, waiting, free_tokens=100) == (1, 300)
    assert vip_prefills([R(0, 900, 0)], [R(0, 100, 0)], free_tokens=10**6) == (0, 0)


def test_the_async_variant_gives_a_vip_prompt_the_step_too():
    sched = scheduler(VipFirstAsyncScheduler)
    add(sched, "doc", 4000, REALTIME)
    sched.schedule()  # async: the next step is scheduled before this one's output
    add(sched, "vip", 900, VIP)
    assert dict(sched.schedule().num_scheduled_tokens) == {"vip": 900}


@pytest.mark.parametrize("policy, chosen, async_scheduling, expected", [
    ("priority", None, False, "serving.guard.vip_first.VipFirstScheduler"),
    ("priority", None, True, "serving.guard.vip_first.VipFirstAsyncScheduler"),
    ("priority", "my.Scheduler", False, "my.Scheduler"),  # the operator's choice wins
    ("fcfs", None, False, None),  # no priorities: no VIP range to put first
])
def test_the_vip_first_scheduler_is_chosen_under_priorities(policy, chosen, async_scheduling,
                                                             expected):
    config = SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, policy=policy,
                             scheduler_cls=chosen, async_scheduling=async_scheduling)
    choose_scheduler(config)
    assert config.scheduler_cls == expected
