"""What the output pump costs per engine request, in CPU seconds of the server's loop.

`ObservedEngine.generate` reads the engine's outputs through a pump task and vLLM's
`RequestOutputCollector`, so that a request's engine slot comes back when the engine is
done with it, not when its client has read everything. This measures the pump alone:
a fake engine yields `tokens` delta outputs per request, `concurrency` requests at a
time, read (A) straight from the engine's generator, as before the pump, and (B)
through `ObservedEngine.generate` (pump, mailbox, slot and ledger bookkeeping). Rounds
alternate A/B and B/A; the figure is process CPU time per request.

    python -m bench.serving.pump_cost [--requests 2000] [--tokens 64] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams

from observe.record import RequestRecord
from observe.stats import WallClock
from serving.engine.observed import ObservedEngine, current_request
from serving.engine.step_receiver import NoStepLedger


class FakeEngine:
    """Yields `tokens` one-token delta outputs, giving the loop a turn between each."""

    def __init__(self, tokens: int):
        self.tokens = tokens

    async def generate(self, prompt, params, request_id, *args, **kwargs):
        for i in range(self.tokens):
            await asyncio.sleep(0)
            done = i == self.tokens - 1
            out = CompletionOutput(0, "x", [7], None, None, "length" if done else None)
            yield RequestOutput(request_id, None, [1, 2], None, [out], done)


async def run(mode: str, requests: int, tokens: int, concurrency: int) -> float:
    fake = FakeEngine(tokens)
    observed = ObservedEngine(fake, NoStepLedger(), WallClock(), admission=None, hang_s=0)
    params = SamplingParams(max_tokens=tokens, output_kind=RequestOutputKind.DELTA)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            rec = RequestRecord(request_id=f"r{i}", arrival=time.monotonic(), endpoint="x")
            current_request.set(rec)
            source = fake if mode == "direct" else observed
            async for _ in source.generate({"prompt_token_ids": [1, 2]}, params, f"r{i}"):
                pass

    started = time.process_time()
    await asyncio.gather(*(one(i) for i in range(requests)))
    return (time.process_time() - started) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    per = {"direct": [], "pump": []}
    for r in range(args.rounds):
        order = ("direct", "pump") if r % 2 == 0 else ("pump", "direct")
        for mode in order:
            per[mode].append(asyncio.run(run(mode, args.requests, args.tokens,
                                             args.concurrency)))
        print(f"round {r + 1} ({order[0]} first): direct {per['direct'][-1] * 1e6:7.1f} "
              f"us/request, pump {per['pump'][-1] * 1e6:7.1f} us/request", flush=True)
    for mode, values in per.items():
        print(f"{mode:6s} median {statistics.median(values) * 1e6:7.1f} us/request "
              f"(min {min(values) * 1e6:.1f}, max {max(values) * 1e6:.1f})")
    extra = [p - d for p, d in zip(per["pump"], per["direct"])]
    print(f"pump - direct: median {statistics.median(extra) * 1e6:.1f} us/request "
          f"(min {min(extra) * 1e6:.1f}, max {max(extra) * 1e6:.1f}), "
          f"{args.tokens} outputs each")


if __name__ == "__main__":
    main()
