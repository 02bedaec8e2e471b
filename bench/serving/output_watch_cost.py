"""What following an engine request's outputs costs, in CPU seconds of the server's loop.

`ObservedEngine.generate` sees each output as vLLM's output handler puts it into the
request's `RequestOutputCollector` (`serving/engine/outputs.py`, `EngineRequest`), so a
request's engine slot comes back when the engine is done with it, not when its client
has read everything. This measures that alone, without an engine: a fake `AsyncLLM`
whose output handler task puts `tokens` one-token delta outputs per request into
vLLM's own collectors (one batch per loop turn, as vLLM's handler does per engine
step), `concurrency` requests at a time, read (A) straight from its `generate()`, as
vLLM's server reads it, and (B) through `ObservedEngine.generate` (the watch, the slot
and ledger bookkeeping, the outcome on the record). Rounds alternate A/B and B/A; the
figure is process CPU time per request.

    python -m bench.serving.output_watch_cost [--requests 2000] [--tokens 64] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import async_llm

from observe.record import RequestRecord
from observe.stats import WallClock
from serving.engine.observed import ObservedEngine, current_request
from serving.engine.step_receiver import NoStepLedger


class FakeAsyncLLM:
    """`AsyncLLM`'s shape: `generate()` makes vLLM's collector for the request (the
    class `async_llm` names, as `AsyncLLM.add_request` does) and reads it; an output
    handler task puts one output into every live collector each loop turn."""

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.live: dict[str, list] = {}  # request id -> [collector, outputs put]
        self.handler: asyncio.Task | None = None

    async def _handle(self) -> None:
        while True:
            await asyncio.sleep(0)
            for rid, state in list(self.live.items()):
                queue, i = state
                done = i == self.tokens - 1
                out = CompletionOutput(0, "x", [7], None, None,
                                       finish_reason="length" if done else None)
                queue.put(RequestOutput(rid, None, [1, 2], None, [out], done))
                state[1] = i + 1
                if done:
                    del self.live[rid]

    async def generate(self, prompt, params, request_id, *args, **kwargs):
        if self.handler is None:
            self.handler = asyncio.create_task(self._handle())
        queue = async_llm.RequestOutputCollector(params.output_kind, request_id)
        self.live[request_id] = [queue, 0]
        finished = False
        while not finished:
            out = queue.get_nowait() or await queue.get()
            finished = out.finished
            yield out


async def run(mode: str, requests: int, tokens: int, concurrency: int) -> float:
    fake = FakeAsyncLLM(tokens)
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
            if mode == "observed":
                assert rec.output_tokens == tokens, rec.output_tokens  # the watch saw all

    started = time.process_time()
    await asyncio.gather(*(one(i) for i in range(requests)))
    fake.handler.cancel()
    return (time.process_time() - started) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    per = {"direct": [], "observed": []}
    for r in range(args.rounds):
        order = ("direct", "observed") if r % 2 == 0 else ("observed", "direct")
        for mode in order:
            per[mode].append(asyncio.run(run(mode, args.requests, args.tokens,
                                             args.concurrency)))
        print(f"round {r + 1} ({order[0]} first): direct {per['direct'][-1] * 1e6:7.1f} "
              f"us/request, observed {per['observed'][-1] * 1e6:7.1f} us/request", flush=True)
    for mode, values in per.items():
        print(f"{mode:8s} median {statistics.median(values) * 1e6:7.1f} us/request "
              f"(min {min(values) * 1e6:.1f}, max {max(values) * 1e6:.1f})")
    extra = [o - d for o, d in zip(per["observed"], per["direct"])]
    print(f"observed - direct: median {statistics.median(extra) * 1e6:.1f} us/request "
          f"(min {min(extra) * 1e6:.1f}, max {max(extra) * 1e6:.1f}), "
          f"{args.tokens} outputs each")


if __name__ == "__main__":
    main()
