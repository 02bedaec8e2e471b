"""What OTLP span export costs per span on the request path, over http/protobuf and gRPC.

Three tracer providers in one process, built as serving/runtime.py builds the server's:

  baseline  create_tracer_provider(sink) with the trace-log row processor only; the sink
            is TraceLog.add("spans", row) on an in-memory trace log, as in the server;
  http      the same plus create_otlp_span_processor(OtlpConfig(endpoint, "http/protobuf"));
  grpc      the same plus create_otlp_span_processor(OtlpConfig(endpoint, "grpc")).

The collectors are tests/otlp_receiver.py's HttpReceiver and GrpcReceiver, run in a
separate process (multiprocessing, spawn) so that decoding does not share this process's
GIL; on this 2-core machine it still shares the CPUs, as a local collector would.

A turn is M finished requests (a RequestRecord each, shaped as a served one: tokenize,
queue, prefill, decode and sampling phases, so 6 spans; ~3% are refused before the
engine and make only the request span) turned into spans with RequestSpans.start() and
RequestSpans.finish() on the calling thread, then provider.force_flush(). Measured per
turn: caller wall = time of the start/finish loop alone (what the request path pays,
including whatever the exporter thread takes of the GIL meanwhile); process CPU =
time.process_time() from the loop's start to after force_flush (every thread of this
process: caller, BatchSpanProcessor worker, gRPC's threads). Outside the timed window
the trace log is flushed (its DuckDB write is the same for every side) and gc runs.

Rounds: one warm-up round (discarded), then N measured rounds; each round runs the
three sides in one of the six orders, cycling, so over a multiple of 6 rounds every side
takes every position equally often. Every side of a round gets identical requests
(seeded by the round). M stays under the span processor's 2048-span queue: 300 requests
make ~1750 spans, so the worker's 512-span exports mostly run during the loop and the
rest in force_flush; the collectors' span counts are checked at the end, so a drop
would show. Ratios are per round (side / baseline of the same round), reported as
median [min, max]; "added" is side minus baseline of the same round, in µs per span.

    .venv/bin/python bench/otlp_overhead.py --rounds 30 --requests 300   # about 20 s
"""

from __future__ import annotations

import argparse
import gc
import itertools
import multiprocessing as mp
import os
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.version import __version__ as OTEL_SDK_VERSION  # noqa: E402

from observe import registry as R  # noqa: E402
from observe.otlp import (  # noqa: E402
    PROTOCOL_GRPC,
    PROTOCOL_HTTP,
    OtlpConfig,
    create_otlp_span_processor,
)
from observe.stats import (  # noqa: E402
    AdmissionLoad,
    EngineTimes,
    LatencyPrediction,
    RequestRecord,
    WallClock,
)
from observe.tracelog import TraceLog  # noqa: E402
from observe.tracing import RequestSpans, create_tracer_provider  # noqa: E402
from slo.targets import DEFAULT_TTFT_TARGET  # noqa: E402

SIDES = ("baseline", PROTOCOL_HTTP, PROTOCOL_GRPC)
ORDERS = tuple(itertools.permutations(SIDES))
MODEL = "Qwen2.5-0.5B-Instruct"
PRIORITIES = (R.PRIORITY_REALTIME, R.PRIORITY_REALTIME, R.PRIORITY_BATCH)


# --- requests ---------------------------------------------------------------------------
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


# --- collectors, in their own process ---------------------------------------------------
def _collectors(conn) -> None:
    from tests.otlp_receiver import GrpcReceiver, HttpReceiver

    with HttpReceiver() as http, GrpcReceiver() as grpc:
        receivers = {PROTOCOL_HTTP: http, PROTOCOL_GRPC: grpc}
        conn.send({name: r.endpoint for name, r in receivers.items()})
        while conn.recv() != "stop":  # "count": spans received per protocol
            conn.send({name: sum(len(ss.spans) for req in r.traces for rs in req.resource_spans
                                 for ss in rs.scope_spans) for name, r in receivers.items()})


# --- measuring --------------------------------------------------------------------------
class Side:
    def __init__(self, name: str, endpoint: str | None, clock: WallClock):
        self.name = name
        self.tracelog = TraceLog(":memory:", flush_interval_s=3600, max_buffer_rows=1_000_000)
        self.provider = create_tracer_provider(lambda row: self.tracelog.add("spans", row))
        if endpoint is not None:
            self.provider.add_span_processor(create_otlp_span_processor(OtlpConfig(endpoint, name)))
        self.spans = RequestSpans(self.provider, clock)
        self.sent = 0

    def turn(self, records: list[RequestRecord]) -> tuple[float, float, int]:
        """(caller wall s, process CPU s, spans) for one turn."""
        start, finish, headers = self.spans.start, self.spans.finish, {}
        before = self.tracelog.stats()["pending_rows"]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for rec in records:
            finish(rec, start(rec, headers))
        wall = time.perf_counter() - wall0
        self.provider.force_flush()
        cpu = time.process_time() - cpu0
        spans = self.tracelog.stats()["pending_rows"] - before
        self.tracelog.flush()
        self.sent += spans
        return wall, cpu, spans

    def close(self) -> None:
        self.provider.shutdown()
        self.tracelog.close()


def records_for(round_: int, requests: int) -> list[RequestRecord]:
    rng = random.Random(round_)
    now = time.monotonic() - 60  # finished within the last minute
    return [request_record(rng, round_ * requests + i, now + i * 0.05) for i in range(requests)]


def spread(values: list[float], fmt: str) -> str:
    return (f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30,
                    help="measured rounds (plus one warm-up); a multiple of 6 balances the orders")
    ap.add_argument("--requests", type=int, default=300, help="requests per side-turn")
    args = ap.parse_args()
    print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]), flush=True)
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[name]  # the SDK's defaults, whatever the shell sets

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    collector = ctx.Process(target=_collectors, args=(child,), daemon=True)
    collector.start()
    endpoints = parent.recv()
    clock = WallClock()
    sides = {name: Side(name, endpoints.get(name), clock) for name in SIDES}
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in SIDES}
    try:
        for round_ in range(args.rounds + 1):
            for name in ORDERS[round_ % len(ORDERS)]:
                records = records_for(round_, args.requests)
                gc.collect()
                measured = sides[name].turn(records)
                if round_:  # round 0 warms up connections, caches and the allocator
                    results[name].append(measured)
            print(f"round {round_}{' (warm-up)' if not round_ else ''}: " + ", ".join(
                f"{n} {sides[n].sent} spans" for n in SIDES), flush=True)
        parent.send("count")
        received = parent.recv()
    finally:
        for side in sides.values():
            side.close()
        parent.send("stop")
        collector.join(10)

    counts = [n for _, _, n in results["baseline"]]
    base = results["baseline"]
    print(f"\nOTLP span export, {args.rounds} rounds x {args.requests} requests "
          f"({min(counts)}-{max(counts)} spans) per side, opentelemetry-sdk {OTEL_SDK_VERSION}; "
          "median [min, max] over rounds")
    print("\n| side | caller wall µs/span | ratio vs baseline | added µs/span | "
          "process CPU µs/span | ratio vs baseline | added µs/span |")
    print("|---|---|---|---|---|---|---|")
    for name in SIDES:
        rows = results[name]
        wall = [w / n * 1e6 for w, _, n in rows]
        cpu = [c / n * 1e6 for _, c, n in rows]
        cells = [spread(wall, ".1f")]
        if name == "baseline":
            cells += ["1", "0", spread(cpu, ".1f"), "1", "0"]
        else:
            bw = [w / n * 1e6 for w, _, n in base]
            bc = [c / n * 1e6 for _, c, n in base]
            cells += [spread([a / b for a, b in zip(wall, bw)], ".2f"),
                      spread([a - b for a, b in zip(wall, bw)], ".1f"),
                      spread(cpu, ".1f"),
                      spread([a / b for a, b in zip(cpu, bc)], ".2f"),
                      spread([a - b for a, b in zip(cpu, bc)], ".1f")]
        label = "baseline (trace-log rows only)" if name == "baseline" else f"+ OTLP {name}"
        print(f"| {label} | " + " | ".join(cells) + " |")
    lost = {n: sides[n].sent - received[n] for n in (PROTOCOL_HTTP, PROTOCOL_GRPC)}
    print("\nspans received by the collectors: " + ", ".join(
        f"{n} {received[n]} of {sides[n].sent}" for n in lost)
        + ("" if not any(lost.values()) else "  ** SPANS LOST: the numbers undercount **"))


if __name__ == "__main__":
    main()
