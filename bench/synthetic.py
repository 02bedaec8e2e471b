"""A synthetic finished request, shaped as the server fills one, for the benchmarks
that need many realistic records without serving them (span export, archive rotation)."""

from __future__ import annotations

import random

from observe import registry as R
from observe.record import AdmissionLoad, LatencyPrediction, RequestRecord
from observe.stats import EngineTimes
from slo.targets import DEFAULT_TTFT_TARGET

MODEL = "Qwen2.5-0.5B-Instruct"
PRIORITIES = (R.PRIORITY_REALTIME, R.PRIORITY_REALTIME, R.PRIORITY_BATCH)


def request_record(rng: random.Random, index: int, arrival: float) -> RequestRecord:
    """A finished request as the server fills it (monotonic `arrival`, seconds): engine
    stamps, sampler tally, admission load, latency prediction, SLO verdict; ~3% are
    refused before the engine (no engine times, no phases)."""
    prompt = rng.choice((40, 300, 900, 2000, 6000, 12_000)) + rng.randrange(200)
    max_tokens = rng.choice((64, 256, 512, 1024))
    output = rng.randrange(1, max_tokens + 1)
    rec = RequestRecord(
        f"chatcmpl-{rng.getrandbits(128):032x}", arrival,
        endpoint=rng.choice(("chat", "chat", "completion")), model=MODEL,
        stream=rng.random() < 0.6, priority=rng.choice(PRIORITIES), prompt_tokens=prompt,
        max_tokens=max_tokens, vip=rng.random() < 0.05)
    rec.slo_ttft_target_s = DEFAULT_TTFT_TARGET(prompt)
    step_s = rng.uniform(0.008, 0.02)
    rec.load = AdmissionLoad(
        queue_depth=rng.randrange(12), running_requests=rng.randrange(1, 48),
        kv_cache_usage=rng.random(), recent_step_s=step_s,
        pending_requests=rng.randrange(8), pending_prefill_tokens=rng.randrange(40_000))
    queue = rng.expovariate(40)
    prefill = prompt * rng.uniform(1.5e-5, 3e-5)
    rec.prediction = LatencyPrediction(
        ttft_s=(queue + prefill) * rng.uniform(0.7, 1.3), ttft_p90_s=(queue + prefill) * 1.8,
        tpot_s=step_s * rng.uniform(0.8, 1.2), tpot_p90_s=step_s * 1.5,
        e2e_s=queue + prefill + max_tokens * step_s, version=f"gbm-{index // 100_000:04d}")
    if rng.random() < 0.03:  # shed by a policy before the engine saw it
        rec.fail(503, "overloaded", "shed by policy ttft_guard: predicted TTFT over target",
                 R.STATUS_REJECTED)
        rec.policy_actions.append("shed")
        rec.end = arrival + rng.uniform(0.0002, 0.002)
        rec.slo_ok = False
        return rec
    accepted = arrival + rng.uniform(0.0005, 0.004)
    queued = accepted + rng.uniform(0.0001, 0.0005)
    scheduled = queued + queue
    first = scheduled + prefill
    last = first + (output - 1) * step_s
    rec.engine = EngineTimes(queued, scheduled, first, last,
                             preemptions=int(rng.random() < 0.01), accepted=accepted)
    sampling = rng.uniform(2e-4, 6e-4)
    tally = rec.tally
    tally.steps, tally.step_s = output, output * step_s
    tally.sampling_s, tally.first_sampling_start = output * sampling, first - sampling
    rec.output_tokens = output
    rec.finish_reason = "length" if output == max_tokens else "stop"
    rec.first_token = first + rng.uniform(0.0002, 0.001)
    rec.end = last + rng.uniform(0.0002, 0.002)
    rec.slo_ok = rec.ttft_s <= rec.slo_ttft_target_s
    if rng.random() < 0.02:
        rec.policy_actions.append("deprioritize")
    return rec
