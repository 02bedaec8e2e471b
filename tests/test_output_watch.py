"""An engine request is followed in vLLM's own output collector (`EngineRequest`):
its slot comes back, and its outcome is on the record, when vLLM's output handler
hands over its last output, whether or not (and however late) the reader reads it;
a failure handed over ends it too; `settle` aborts what still runs. On a fake
`AsyncLLM` that makes vLLM's real collector the way `AsyncLLM.add_request` does."""

from __future__ import annotations

import asyncio
import time

import pytest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import async_llm
from vllm.v1.engine.exceptions import EngineDeadError

from observe.record import RequestRecord
from observe.stats import WallClock
from serving.engine.observed import ObservedEngine, current_request
from serving.engine.step_receiver import NoStepLedger

DELTA = SamplingParams(max_tokens=3, output_kind=RequestOutputKind.DELTA)


class HandedEngine:
    """`AsyncLLM`'s shape; the test plays its output handler (`hand`)."""

    errored = False

    def __init__(self):
        self.queues: dict[str, object] = {}
        self.aborted: list[str] = []

    async def generate(self, prompt, params, request_id, *args, **kwargs):
        queue = async_llm.RequestOutputCollector(params.output_kind, f"{request_id}-int")
        self.queues[request_id] = queue
        try:
            while not (out := queue.get_nowait() or await queue.get()).finished:
                yield out
            yield out
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(queue.request_id, internal=True)
            raise

    async def abort(self, ids, internal: bool = False) -> None:
        for rid in [ids] if isinstance(ids, str) else ids:
            self.aborted.append(rid)
            queue = self.queues[rid.removesuffix("-int")]
            queue.put(_output(rid, [], "abort"))

    def hand(self, request_id: str, tokens: list[int], finish: str | None = None) -> None:
        self.queues[request_id].put(_output(request_id, tokens, finish))


def _output(rid: str, tokens: list[int], finish: str | None) -> RequestOutput:
    out = CompletionOutput(0, "x" * len(tokens), tokens, None, None, finish_reason=finish)
    return RequestOutput(rid, None, [1, 2, 3], None, [out], finish is not None)


async def _submitted(engine: HandedEngine, rid: str = "r1"):
    """(observed engine, record, its stream, the reader's first read, pending): the
    request is in the engine, its collector made."""
    observed = ObservedEngine(engine, NoStepLedger(), WallClock(), admission=None, hang_s=0)
    rec = RequestRecord(request_id=rid, arrival=time.monotonic(), endpoint="x")
    current_request.set(rec)
    stream = observed.generate({"prompt_token_ids": [1, 2, 3]}, DELTA, rid)
    reading = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    return observed, rec, stream, reading


def test_the_last_output_handed_over_ends_the_request_before_anyone_reads_it():
    async def run():
        engine = HandedEngine()
        observed, rec, stream, reading = await _submitted(engine)
        engine.hand("r1", [7])
        first = await reading
        assert first.outputs[0].token_ids == [7] and rec.first_token is not None
        assert observed.in_flight == 1 and rec.output_tokens == 0
        engine.hand("r1", [8])  # the reader is not reading: deltas merge in the collector
        engine.hand("r1", [9], "length")
        assert observed.in_flight == 0  # its slot is back, nothing read since the first
        assert (rec.output_tokens, rec.prompt_tokens, rec.finish_reason) == (3, 3, "length")
        rest = [out async for out in stream]
        assert [t for out in rest for t in out.outputs[0].token_ids] == [8, 9]
        assert (rec.output_tokens, observed.in_flight) == (3, 0)  # counted once

    asyncio.run(run())


def test_a_failure_handed_over_ends_the_request_and_names_the_engine():
    async def run():
        engine = HandedEngine()
        observed, rec, stream, reading = await _submitted(engine)
        engine.queues["r1"].put(EngineDeadError())  # vLLM's propagate_error
        assert observed.in_flight == 0 and observed.fault == "engine_dead"
        with pytest.raises(EngineDeadError):
            await reading
        assert observed.outcome("r1") is not None

    asyncio.run(run())


def test_a_reader_gone_early_aborts_the_engine_request_and_frees_its_slot():
    async def run():
        engine = HandedEngine()
        observed, rec, stream, reading = await _submitted(engine)
        engine.hand("r1", [7])
        await reading
        await stream.aclose()
        assert engine.aborted == ["r1-int"] and observed.in_flight == 0
        assert (rec.output_tokens, rec.finish_reason) == (1, "abort")

    asyncio.run(run())


def test_settle_aborts_what_still_runs_and_waits_for_its_end():
    async def run():
        engine = HandedEngine()
        observed, rec, stream, reading = await _submitted(engine)
        await observed.settle("r1")  # its client left; vLLM did not close the stream
        assert engine.aborted == ["r1-int"] and observed.in_flight == 0
        assert (await reading).finished
        await observed.settle("r1")  # nothing left: a no-op
        assert engine.aborted == ["r1-int"]

    asyncio.run(run())


def test_a_fault_in_following_an_output_never_reaches_vllms_output_handler(caplog):
    """The watch runs inside vLLM's output handler, where an exception would fail every
    request in flight: it is logged, and the output still reaches its reader."""
    async def run():
        engine = HandedEngine()
        observed, rec, stream, reading = await _submitted(engine)

        def broken(watch):
            raise RuntimeError("bookkeeping bug")

        observed.request_ended = broken
        engine.hand("r1", [7], "length")  # vLLM's handler: must not raise
        assert (await reading).finished

    asyncio.run(run())
    assert "its output could not be followed" in caplog.text
