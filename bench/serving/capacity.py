"""Benchmark: capacity per context bucket on this machine.

For each bucket, steady open-loop load with prompts of that bucket's typical length is
offered at increasing rates against a running tailguard server; the capacity is the
highest rate at which P99 TTFT stays within the context-aware target (SPEC §3) and no
request fails. Rates are searched by doubling, then bisection.

    python -m tailguard serve --port 8000 &   # then:
    python -m bench.serving.capacity --url http://127.0.0.1:8000 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio

from loadgen.report import percentile
from loadgen.runner import Target, discover, run
from loadgen.workload import Workload
from slo.targets import DEFAULT_TTFT_TARGET

# (bucket, prompt tokens) — the longest bucket the embedded model's context allows.
BUCKETS = (("0-1k", (400, 600)), ("1k-4k", (2000, 3000)))


def probe(target: Target, rate: float, prompts: tuple[int, int], duration: float,
          output_tokens: int, seed: int) -> tuple[bool, float | None, int]:
    workload = Workload("steady", rate, duration, 100_000, output_tokens=output_tokens,
                        seed=seed, prompt_range=prompts)
    results = asyncio.run(run(target, workload))
    ok = [r for r in results if r.status == "ok"]
    p99 = percentile([r.ttft_s for r in ok if r.ttft_s is not None], 99)
    limit = DEFAULT_TTFT_TARGET(max(prompts))
    passed = len(ok) == len(results) and p99 is not None and p99 <= limit
    return passed, p99, len(results)


def capacity(target, prompts, duration, output_tokens, start=0.5, steps=4):
    low, high, rate, seen = 0.0, None, start, []
    while high is None and rate <= 64:
        passed, p99, n = probe(target, rate, prompts, duration, output_tokens, len(seen))
        seen.append((rate, passed, p99, n))
        low, high, rate = (rate, None, rate * 2) if passed else (low, rate, rate)
    for _ in range(steps if high else 0):
        rate = (low + high) / 2
        passed, p99, n = probe(target, rate, prompts, duration, output_tokens, len(seen))
        seen.append((rate, passed, p99, n))
        low, high = (rate, high) if passed else (low, rate)
    return low, seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--output-tokens", type=int, default=32)
    args = ap.parse_args()
    model, _ = discover(args.url)
    target = Target(args.url, model)
    rows = []
    for bucket, prompts in BUCKETS:
        best, seen = capacity(target, prompts, args.duration, args.output_tokens)
        for rate, passed, p99, n in seen:
            print(f"{bucket}: {rate:.2f} req/s -> p99 TTFT {p99 if p99 is None else round(p99, 3)} s"
                  f" over {n} requests: {'pass' if passed else 'fail'}", flush=True)
        rows.append((bucket, prompts, DEFAULT_TTFT_TARGET(max(prompts)), best))
    print("\n| context bucket | prompt tokens | P99 TTFT target | capacity (req/s) |")
    print("|---|---|---|---|")
    for bucket, prompts, limit, best in rows:
        print(f"| {bucket} | {prompts[0]}-{prompts[1]} | {limit:.2f} s | {best:.2f} |")
    print(f"\noutput tokens per request: {args.output_tokens}; {args.duration:g} s per probe")


if __name__ == "__main__":
    main()
