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

    python -m bench.serving.otlp_overhead --rounds 30 --requests 300   # about 20 s
"""

from __future__ import annotations

import argparse
import gc
import itertools
import multiprocessing as mp
import os
import random
import statistics
import time

from opentelemetry.sdk.version import __version__ as OTEL_SDK_VERSION

from bench.common import command_line
from bench.synthetic import request_record
from observe.otlp import (
    PROTOCOL_GRPC,
    PROTOCOL_HTTP,
    OtlpConfig,
    create_otlp_span_processor,
)
from observe.record import RequestRecord
from observe.stats import WallClock
from observe.tracelog import TraceLog
from observe.tracing import RequestSpans, create_tracer_provider

SIDES = ("baseline", PROTOCOL_HTTP, PROTOCOL_GRPC)
ORDERS = tuple(itertools.permutations(SIDES))


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
    print("command: " + command_line(__spec__.name), flush=True)
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
