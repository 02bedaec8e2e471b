"""Everything one server process owns, wired in data-path order:
admission -> engine -> step ledger / stat logger -> spans, metrics, trace log ->
observer (SLO verdicts) -> guard (policies) -> admission.

`Runtime.start()` brings it up (the engine last, since it is the slow part) and
`stop()` takes it down in reverse, flushing the trace log last. The request handlers
get only `Runtime.deps`: the typed few parts a request touches (`RequestDeps`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from observe import settings
from observe.archive import Rotator
from observe.metrics import RequestMetrics, create_prometheus_export
from observe.otlp import create_otlp_metric_reader, create_otlp_span_processor
from observe.settings import TAILGUARD_PROFILE_SERVER
from observe.span_rows import RowSpans
from observe.stats import WallClock
from observe.tracelog import TraceLog
from observe.tracing import RequestSpans, create_tracer_provider
from serving.admin.auth import resolve_admin_token
from serving.admission import Admission
from serving.compat.responses import ResponsesServing
from serving.config import ServerConfig
from serving.engine.allocator import freeze_heap, thaw_heap
from serving.engine.fault_injection import FaultInjector
from serving.engine.live_model import LiveEngineModel, engine_limits
from serving.engine.load import LoadTracker, ResidentBytes
from serving.engine.observed import ObservedEngine
from serving.engine.setup import start_engine, vllm_namespace
from serving.engine.stats import EngineSecond, stat_logger_factory
from serving.engine.step_receiver import StepLedger
from serving.engine.warmup import WarmupGate, warm_up
from serving.guard.live_forecast import ForecastService
from serving.guard.live_predictor import PredictionService
from serving.guard.loop import Guard
from serving.guard.loop_lag import LoopLagMonitor
from serving.guard.periodic import Periodic
from serving.keys import KeyRing
from serving.observer import Observer
from serving.profiling import start_profiling, stop_profiling
from serving.quota import SequenceQuota

log = logging.getLogger("tailguard")


@dataclass(slots=True)
class EngineHandle:
    """The engine and vLLM's OpenAI serving objects built on it."""

    engine: object
    args: object
    chat: object
    completion: object
    models: object
    responses: object  # serving.compat.responses.ResponsesServing
    tokenization: object


class EngineSlot:
    """The engine serving now: none while it starts, nor while breaker L2 restarts it."""

    __slots__ = ("handle", "restarting")

    def __init__(self) -> None:
        self.handle: EngineHandle | None = None
        self.restarting = False  # breaker L2's restart is under way

    @property
    def ready(self) -> bool:
        return self.handle is not None and not getattr(self.handle.engine, "errored", False)

    @property
    def dead(self) -> bool:
        """The engine died, and is not back from its restart yet."""
        errored = self.handle is not None and getattr(self.handle.engine, "errored", False)
        return errored or self.restarting


@dataclass(frozen=True, slots=True)
class RequestDeps:
    """What a generation request touches (`serving.generation`), built once."""

    config: ServerConfig  # body and n limits, the model's name, the stream write timeout
    observer: Observer  # the record and its span in, spans/metrics/a row out
    keys: KeyRing  # who calls: priority tier, VIP flag, the quota's client
    quota: SequenceQuota
    admission: Admission
    engine: EngineSlot


class Runtime:
    def __init__(self, config: ServerConfig):
        self.config = config
        # first: an unusable token refuses the start before any file is opened
        self.admin_token, self.admin_token_source = resolve_admin_token(
            config.db, config.admin_token_file)
        self.clock = WallClock()
        self.tracelog = TraceLog(config.db, flush_interval_s=config.flush_interval_s)
        self.tracer_provider = create_tracer_provider(lambda row: self.tracelog.add("spans", row))
        self.metrics_export = create_prometheus_export(
            extra_readers=[create_otlp_metric_reader(config.otlp)] if config.otlp else (),
            resource=self.tracer_provider.resource)
        if config.otlp:  # the same spans, also to a collector, batched off the hot path
            self.tracer_provider.add_span_processor(create_otlp_span_processor(config.otlp))
        self.metrics = RequestMetrics(self.metrics_export.provider.get_meter("tailguard"),
                                      config.latency_buckets, config.native_histograms)
        self.spans = self._spans(config)
        self.observer = Observer(self.tracelog, self.spans, self.metrics, self.clock, config.spec,
                                 config.keys.names)
        self.second = EngineSecond()
        self.load = LoadTracker(self.second)
        self.predictor = PredictionService(self.tracelog, config.predictor_path,
                                           config.retrain_interval_s)
        self.faults = FaultInjector(config.enable_fault_injection)
        self.guard = Guard(config.policies, self.tracelog, self.metrics, self.faults)
        self.observer.listeners.append(self.guard.on_request)
        self.observer.listeners.append(self.predictor.on_request)  # drift: retrain sooner
        self.quota = SequenceQuota(config.max_sequences, config.max_client_sequences)
        self.observer.listeners.append(self.quota.release)
        self.engine_model = LiveEngineModel()  # calibrated by every step, warm-up's too
        self.observer.listeners.append(self.engine_model.on_request)  # and the overhead
        self.admission = Admission(self.load, self.predictor, self.guard.limiter, self.faults,
                                   self.observer.judge.ttft_target, self.engine_model)
        self.forecast = ForecastService(self.tracelog, config.forecaster_path,
                                        self.metrics.record_forecast,
                                        reselect_s=config.reselect_interval_s)
        self.warmup_gate = WarmupGate(on_live=self.second.take)  # warm-up: not live load
        live, batch = self.warmup_gate.live_only, self.metrics.record_step
        self.ledger = StepLedger([self.warmup_gate.marking(self.spans.step),
                                  live(self.second.on_step),
                                  live(lambda step: batch(len(step.request_ids)))],
                                 at_once=[live(self.load.on_step), self.engine_model.on_step])
        self.engine = EngineSlot()
        self.deps = RequestDeps(config, self.observer, config.keys, self.quota,
                                self.admission, self.engine)
        self.warmup: list = []
        self._ticker: asyncio.Task | None = None
        self.loop_lag = LoopLagMonitor(self.metrics.record_loop_lag)
        self._resident = ResidentBytes()
        self._archiver: Periodic | None = None
        self.rotator: Rotator | None = None
        self._dropped_seen: dict[str, int] = {}

    def _spans(self, config: ServerConfig):
        """OpenTelemetry spans where more than the trace log listens (an OTLP collector,
        the profiler); else the same rows straight to the trace log, no SDK span each."""
        if config.otlp or config.profiling:
            return RequestSpans(self.tracer_provider, self.clock)
        return RowSpans(lambda row: self.tracelog.add("spans", row), self.clock)

    @property
    def handle(self) -> EngineHandle | None:
        return self.engine.handle

    @handle.setter
    def handle(self, handle: EngineHandle | None) -> None:
        self.engine.handle = handle

    @property
    def ready(self) -> bool:
        return self.engine.ready

    @property
    def engine_failed(self) -> bool:
        """What breaker L2 watches: the engine died (not back from a restart yet), or a drill."""
        return self.engine.dead or self.faults.failing

    async def start(self) -> None:
        if self.config.profiling:  # the engine core starts its own agent (step_plugin)
            settings.export(TAILGUARD_PROFILE_SERVER, self.config.profiling.server_url)
        self.loop_lag.start()  # first: the engine's start and warm-up show in it too
        self.ledger.start()
        self._args = vllm_namespace(self.config.model, self.config.served_model_name,
                                    self.config.vllm_args)
        self.guard.start(self)  # overrides restored and decided before the first request
        self.handle = await self._start_engine()
        self._ticker = asyncio.create_task(self._tick_engine_seconds())
        self.predictor.start()
        self.forecast.start()
        self._start_archive()
        if self.config.profiling:  # after the engine exists: the agent must not be forked
            start_profiling(self.config.profiling, self.config.model_name, self.tracer_provider)
        log.info("tailguard ready: model %s, trace log %s", self.config.model_name,
                 self.config.db)

    def _start_archive(self) -> None:
        if self.config.archive is None:
            return
        rotator = Rotator(self.config.archive)

        def rotate() -> None:
            try:
                moved = rotator.rotate(self.tracelog)
                if any(moved.values()):
                    log.info("archived %s to %s", moved, self.config.archive.archive_dir)
            except Exception:  # nothing is lost; the next rotation retries
                log.exception("archive rotation failed")

        self.rotator = rotator
        self._archiver = Periodic("tailguard-archive", self.config.archive.interval_s, rotate)
        threading.Thread(target=rotate, name="tailguard-archive-catch-up", daemon=True).start()
        self._archiver.start()

    async def _start_engine(self, restart: bool = False) -> EngineHandle:
        """A new engine, warm; a restart keeps the first start's warm-up report."""
        began = time.monotonic()
        engine = await asyncio.to_thread(start_engine, self._args,
                                         [stat_logger_factory(self.second)])
        started = time.monotonic()
        limits = engine_limits(engine.vllm_config)
        self.engine_model.set_engine_limits(**limits)
        self.guard.limiter.prefill_chunk_cap = limits["chunk_cap"]
        self.warmup_gate.warming()
        calls = await warm_up(engine, engine.model_config.max_model_len,
                              engine.model_config.get_vocab_size(), measure=not restart)
        self.warmup_gate.went_live()
        self.warmup = self.warmup if restart else calls
        warmed = time.monotonic()
        handle = await _serving_handle(ObservedEngine(engine, self.ledger, self.clock,
            self.admission, on_failure=self.guard.wake), self._args)
        served, frozen = time.monotonic(), freeze_heap()  # the start-up heap, out of GC scans
        log.info("engine up in %.1f s: start %.1f s, warm-up %.1f s, serving objects %.1f s;"
                 " %d objects out of the garbage collector's scans", served - began,
                 started - began, warmed - started, served - warmed, frozen)
        return handle

    async def restart_engine(self) -> None:
        """Breaker L2: a fresh engine in place; the server keeps answering (503 until
        the new engine is warm)."""
        old, self.handle, self.engine.restarting = self.handle, None, True
        log.warning("restarting the engine")
        began = time.monotonic()
        try:
            if old is not None:
                thaw_heap()  # what the old engine held must be collectable
                old.engine.shutdown()
            shut = time.monotonic()
            self.handle = await self._start_engine(restart=True)
        finally:
            self.engine.restarting = False
        log.warning("engine restarted in %.1f s (old engine shut down in %.1f s)",
                    time.monotonic() - began, shut - began)

    async def _tick_engine_seconds(self) -> None:
        """Once a second: an `engine_stats` row and the engine gauges."""
        while True:
            await asyncio.sleep(1.0)
            snap = self.second.take(rss_bytes=self._resident())
            self.metrics.record_engine(snap)
            self.tracelog.add("engine_stats", snap.row(self.clock))
            self.forecast.observe(snap, self.clock.epoch(snap.ts))
            self.guard.on_engine_second(snap)
            self._report_dropped()

    def _report_dropped(self) -> None:
        """Turn the writer's cumulative drop counts into counter increments."""
        for table, total in self.tracelog.stats()["rows_dropped"].items():
            self.metrics.record_dropped(table, total - self._dropped_seen.get(table, 0))
            self._dropped_seen[table] = total

    async def stop(self) -> None:
        if self._archiver is not None:
            self._archiver.stop()
        stop_profiling()
        self.predictor.stop()
        self.forecast.stop()
        self.guard.stop()
        self.loop_lag.stop()
        if self._ticker:
            self._ticker.cancel()
        if self.handle:
            thaw_heap()
            self.handle.engine.shutdown()
            self.handle = None
        self.ledger.close()
        self.tracer_provider.shutdown()
        self.metrics_export.shutdown()
        self.tracelog.close()


async def _serving_handle(engine: ObservedEngine, args) -> EngineHandle:
    """vLLM's own app state (chat, completion, responses, models, tokenization) on ours."""
    from starlette.datastructures import State
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state

    tasks = await engine.get_supported_tasks()
    state = State()
    await init_app_state(engine, state, args, tasks)
    return EngineHandle(engine, args, state.openai_serving_chat,
                        state.openai_serving_completion, state.openai_serving_models,
                        ResponsesServing(state.openai_serving_responses, engine),
                        state.serving_tokenization)
