"""Benchmark: where the server's CPU per request goes on the observation path, piece
by piece, without an engine (the engine's share is the vs-vLLM benchmark's subject).

A fixed, realistic finished request (300 prompt tokens, 16 output tokens, served in
17 engine steps beside 15 other requests) goes through exactly what the server does
with it: the record begins (`Observer.begin`), every engine step is published to the
ledger's consumers, and the record finishes (`Observer.finish`: SLO verdicts,
prediction accuracy, spans, metrics, the trace-log row, the listeners: policy engine,
predictor calibration and drift watch, quota). The trace log is a real DuckDB file,
flushed by its own thread; its flush CPU is read from that thread's clock.

Each piece is timed with the calling thread's CPU clock (`time.thread_time_ns`), so
the figures hold still on a noisy machine. Two sides alternate each round, order
alternating: spans and metrics through the OpenTelemetry SDK ("otel", what the server
does when an OTLP exporter listens, and did always before issue 20) and spans written
as rows with metrics kept natively ("rows", the default); the report gives every
round and the medians.

    python -m bench.serving.hot_path --requests 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench.common import command_line
from observe import registry as R
from observe.record import AdmissionLoad, LatencyPrediction
from observe.stats import EngineTimes, StepRecord, WallClock

BATCH = 16
OUTPUT_TOKENS = 16


class Timer:
    """Thread-CPU nanoseconds per named piece."""

    def __init__(self):
        self.ns: dict[str, int] = defaultdict(int)

    def __call__(self, name: str, fn, *args):
        began = time.thread_time_ns()
        out = fn(*args)
        self.ns[name] += time.thread_time_ns() - began
        return out


def build(tmp: Path, side: str):
    """The server's observation objects, wired as `serving.runtime.Runtime` wires them;
    `side` "otel": spans and metrics through the OpenTelemetry SDK (what the server
    does with an OTLP exporter, and did always before issue 20), "rows": spans written
    straight to the trace log, metrics kept natively (the default since)."""
    from prometheus_client import CollectorRegistry

    from observe.metrics import RequestMetrics, create_prometheus_export
    from observe.span_rows import RowSpans
    from observe.tracelog import TraceLog
    from observe.tracing import RequestSpans, create_tracer_provider
    from serving.engine.live_model import LiveEngineModel
    from serving.engine.load import LoadTracker
    from serving.config import load_policy_config
    from serving.engine.fault_injection import FaultInjector
    from serving.engine.stats import EngineSecond
    from serving.guard.live_predictor import PredictionService
    from serving.guard.loop import Guard
    from serving.observer import Observer
    from serving.quota import SequenceQuota

    clock = WallClock()
    tracelog = TraceLog(str(tmp / "trace.duckdb"), flush_interval_s=0.2)
    provider = create_tracer_provider(lambda row: tracelog.add("spans", row))
    export = create_prometheus_export(registry=CollectorRegistry(), native=side == "rows")
    metrics = RequestMetrics(export.provider.get_meter("tailguard"))
    spans = (RequestSpans(provider, clock) if side == "otel"
             else RowSpans(lambda row: tracelog.add("spans", row), clock))
    observer = Observer(tracelog, spans, metrics, clock)
    second = EngineSecond()
    load = LoadTracker(second)
    predictor = PredictionService(tracelog, None, 0)
    guard = Guard(load_policy_config(None), tracelog, metrics, FaultInjector(False))
    quota = SequenceQuota(256, 256)
    observer.listeners += [guard.on_request, predictor.on_request, quota.release]
    engine_model = LiveEngineModel()
    consumers = {"step.span": spans.step, "step.second": second.on_step,
                 "step.metric": lambda s: metrics.record_step(len(s.request_ids)),
                 "step.load": load.on_step, "step.engine_model": engine_model.on_step}
    return observer, consumers, tracelog, export, provider


def finished(rec, clock_now: float) -> None:
    """Fill `rec` as a served request: engine stamps, tokens, load and prediction."""
    t = rec.arrival
    rec.model, rec.prompt_tokens, rec.output_tokens = "tailguard-tiny-llama", 300, OUTPUT_TOKENS
    rec.max_tokens, rec.client, rec.finish_reason = OUTPUT_TOKENS, "anonymous", "length"
    rec.engine = EngineTimes(queued=t + 0.004, scheduled=t + 0.006, first_token=t + 0.05,
                             last_token=t + 0.35, accepted=t + 0.003, first_token_seen=t + 0.051)
    rec.first_token, rec.end = t + 0.051, clock_now
    rec.load = AdmissionLoad(2, 14, 0.3, 0.02, 1, 300)
    rec.prediction = LatencyPrediction(0.05, 0.08, 0.02, 0.03, 0.4, "engine-queue")
    rec.ttft_estimate_s = 0.045
    rec.slo_ttft_target_s = 0.2


def one_request(observer, consumers, timer: Timer, i: int, step_index: int) -> int:
    rec, span = timer("observer.begin", observer.begin, "/v1/completions", {})
    for k in range(OUTPUT_TOKENS + 1):
        ids = (rec.request_id,) + tuple(f"other-{j}" for j in range(BATCH - 1))
        step = StepRecord(step_index + k, rec.arrival + 0.006 + 0.02 * k, 0.018, 0.002,
                          BATCH + (300 if k == 0 else 0), ids)
        rec.tally.add(step.start, step.duration_s, step.sampling_s)
        for name, consumer in consumers.items():
            timer(name, consumer, step)
    finished(rec, time.monotonic())
    timer("observer.finish", observer.finish, rec, span)
    return step_index + OUTPUT_TOKENS + 1


def flush_thread_cpu_ns(tracelog) -> int:
    thread = tracelog._thread  # the writer's own thread: its CPU is the flush's
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


def run_round(requests: int, side: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        observer, consumers, tracelog, export, _ = build(Path(tmp), side)
        timer, step_index = Timer(), 0
        for i in range(50):  # warm caches (lru, instruments' label sets)
            step_index = one_request(observer, consumers, Timer(), i, step_index)
        tracelog.flush()
        flush_before = flush_thread_cpu_ns(tracelog)
        for i in range(requests):
            step_index = one_request(observer, consumers, timer, i, step_index)
        began = time.thread_time_ns()
        tracelog.flush()  # what the writer thread had not written yet, on this thread
        timer.ns["tracelog.flush"] += (time.thread_time_ns() - began
                                       + flush_thread_cpu_ns(tracelog) - flush_before)
        tracelog.close()
        export.shutdown()
    # a step carries BATCH requests: each request's share is 1/BATCH of its steps
    return {name: ns / requests / 1000 / (BATCH if name.startswith("step.") else 1)
            for name, ns in timer.ns.items()}


SIDES = ("otel", "rows")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    for r in range(1, args.rounds + 1):
        for side in (SIDES if r % 2 else SIDES[::-1]):  # order alternates by round
            results[side].append(run_round(args.requests, side))
            pieces = results[side][-1]
            print(f"round {r} {side}: {sum(pieces.values()):.0f} µs/request  " + "  ".join(
                f"{k} {v:.1f}" for k, v in sorted(pieces.items())), flush=True)
    print(f"\n{args.requests} requests x {args.rounds} rounds per side, order alternating; "
          f"each request in {OUTPUT_TOKENS + 1} steps of {BATCH} requests (a step's cost is "
          f"shared by its {BATCH}); thread CPU µs per request, median [min-max]\n")
    names = sorted(results["otel"][0], key=lambda k: -results["otel"][0][k])
    print("| piece | OpenTelemetry SDK | rows + native metrics | rows/otel per round |")
    print("|---|---:|---:|---:|")
    for name in names + ["total"]:
        cells, per_side = [], {}
        for side in SIDES:
            values = [sum(r.values()) if name == "total" else r[name] for r in results[side]]
            per_side[side] = values
            cells.append(f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]")
        ratios = [b / a for a, b in zip(per_side["otel"], per_side["rows"])]
        print(f"| {name} | " + " | ".join(cells) + f" | {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}] |")
    print("\ncommand: " + command_line(__spec__.name))


if __name__ == "__main__":
    main()
