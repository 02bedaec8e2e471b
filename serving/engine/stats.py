"""Per-second engine statistics: a vLLM stat logger plus the step probe feed one
accumulator; once a second the server takes an `EngineSnapshot` out of it."""

from __future__ import annotations

import threading
import time

from observe.stats import EngineSnapshot, StepRecord


class EngineSecond:
    """Accumulates one interval of engine activity; `take()` closes it."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self._reset()

    def _reset(self) -> None:
        self.preemptions = self.prompt_tokens = self.generation_tokens = 0
        self.finished = self.iterations = 0
        self.steps = self.batch_sum = self.max_batch = 0
        self.step_s = self.sampling_s = 0.0

    def on_scheduler(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        self.running, self.waiting, self.kv_cache_usage = running, waiting, kv_cache_usage

    def on_iteration(self, prompt_tokens: int, generation_tokens: int,
                     preemptions: int, finished: int) -> None:
        with self._lock:
            self.iterations += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += generation_tokens
            self.preemptions += preemptions
            self.finished += finished

    def on_step(self, step: StepRecord) -> None:
        batch = len(step.request_ids)
        with self._lock:
            self.steps += 1
            self.batch_sum += batch
            self.max_batch = max(self.max_batch, batch)
            self.step_s += step.duration_s
            self.sampling_s += step.sampling_s

    def take(self, now: float | None = None, rss_bytes: int | None = None) -> EngineSnapshot:
        with self._lock:
            # Without the step probe (e.g. a remote engine) fall back to vLLM's count.
            steps = self.steps or self.iterations
            snap = EngineSnapshot(
                ts=time.monotonic() if now is None else now,
                running=self.running, waiting=self.waiting,
                kv_cache_usage=self.kv_cache_usage, preemptions=self.preemptions,
                prompt_tokens=self.prompt_tokens, generation_tokens=self.generation_tokens,
                steps=steps,
                mean_batch_size=self.batch_sum / self.steps if self.steps else 0.0,
                max_batch_size=self.max_batch,
                mean_step_s=self.step_s / self.steps if self.steps else None,
                mean_sampling_s=self.sampling_s / self.steps if self.steps else None,
                finished=self.finished, rss_bytes=rss_bytes)
            self._reset()
        return snap


def stat_logger_factory(second: EngineSecond):
    """A vLLM `StatLoggerBase` class bound to `second` (vLLM instantiates it)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TailguardStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None,
                   engine_idx: int = 0, *args, **kwargs):
            if scheduler_stats is not None:
                second.on_scheduler(scheduler_stats.num_running_reqs,
                                    scheduler_stats.num_waiting_reqs,
                                    scheduler_stats.kv_cache_usage)
            if iteration_stats is not None:
                second.on_iteration(iteration_stats.num_prompt_tokens,
                                    iteration_stats.num_generation_tokens,
                                    iteration_stats.num_preempted_reqs,
                                    len(iteration_stats.finished_requests))

        def log_engine_initialized(self):
            pass

    return TailguardStatLogger
