"""Engine-step probe, loaded by vLLM as a general plugin in every engine process.

vLLM's per-request stats carry no sampling time, so we time the model runner's two
halves of each step, `execute_model` (forward) and `sample_tokens` (sampler), where
they run: in the engine-core process. Each step goes to the server as one datagram
on a Unix socket whose path the server puts in `TAILGUARD_STEP_SOCKET` before the
engine starts. Sending never blocks the engine: a full socket drops the record and
counts it. Without the variable the plugin does nothing.

Wall times of `execute_model`/`sample_tokens` are exact on CPU, where both run
synchronously; on CUDA they measure launch plus any synchronisation vLLM performs.
"""

from __future__ import annotations

import atexit
import json
import logging
import socket
import time
from contextlib import nullcontext

from observe import settings  # stdlib only: cheap in every engine process
from observe.settings import TAILGUARD_PROFILE_SERVER, TAILGUARD_STEP_SOCKET
from slo.sim.engine_model import attention_pairs

_PATCHED_FLAG = "_tailguard_step_probe"


class StepSender:
    """Packs one step into a datagram and sends it without ever waiting."""

    __slots__ = ("path", "sock", "index", "dropped", "_pending", "_progress")

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.index = 0
        self.dropped = 0
        self._pending: tuple | None = None
        self._progress: tuple[list, list, int] = ([], [], 0)

    def forward_starts(self, runner, scheduler_output) -> None:
        try:
            self._progress = prefill_progress(runner, scheduler_output)
        except Exception:  # vLLM's internals moved: the server falls back on outputs
            self._progress = ([], [], 0)

    def forward_done(self, start: float, end: float, scheduler_output) -> None:
        tokens = scheduler_output.num_scheduled_tokens
        (ends, chunks, pairs), self._progress = self._progress, ([], [], 0)
        if tokens:
            self._pending = (start, end - start, scheduler_output.total_num_scheduled_tokens,
                             list(tokens), ends, chunks, pairs)

    def sampling_done(self, start: float, end: float) -> None:
        self.send(end - start if self._pending else 0.0)

    def send(self, sampling_s: float) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start, forward_s, tokens, req_ids, ends, chunks, pairs = pending
        self.index += 1
        payload = json.dumps([self.index, start, forward_s, sampling_s, tokens, req_ids,
                              ends, chunks, pairs])
        try:
            self.sock.sendto(payload.encode(), self.path)
        except OSError:  # server gone or socket full: the engine must not care
            self.dropped += 1


def prefill_progress(runner, scheduler_output) -> tuple[list[str], list[list], int]:
    """What this step does to prompts: the requests whose prompt it finishes (their first
    token comes out of it) and `[request, tokens]` for each prompt it advances by a
    chunk without finishing (a long prompt under chunked prefill; a prefix-cache hit
    counts as done when the request is first scheduled). The server learns it here for
    every request, streamed or not (a non-streamed one shows no output before its
    last), so the limiter's prefill gate and the work ahead of newcomers let go of a
    prompt as the engine works through it, not only at its end. Also the step's
    attention pairs (`slo.sim.engine_model.attention_pairs`, summed over its requests,
    decodes included): what a step over long contexts costs beyond its token count."""
    scheduled = scheduler_output.num_scheduled_tokens
    ends, chunks, pairs = [], [], 0
    for new in scheduler_output.scheduled_new_reqs:
        step = scheduled.get(new.req_id, 0)
        pairs += attention_pairs(new.num_computed_tokens, step)
        done = new.num_computed_tokens + step
        if done >= len(new.prompt_token_ids or ()):
            ends.append(new.req_id)
        elif done:
            chunks.append([new.req_id, done])
    cached, states = scheduler_output.scheduled_cached_reqs, runner.requests
    for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens):
        step = scheduled.get(req_id, 0)
        pairs += attention_pairs(computed, step)
        state = states.get(req_id)
        if state is None or computed >= state.num_prompt_tokens:
            continue  # gone, or decoding
        if computed + step >= state.num_prompt_tokens:
            ends.append(req_id)
        elif step:
            chunks.append([req_id, step])
    return ends, chunks, pairs


def _wrap(runner_cls, sender: StepSender | None) -> None:
    execute_model, sample_tokens = runner_cls.execute_model, runner_cls.sample_tokens

    def timed_execute_model(self, scheduler_output, *args, **kwargs):
        if sender is not None:
            sender.forward_starts(self, scheduler_output)
        start = time.monotonic()
        with _step_profile(self, scheduler_output):
            out = execute_model(self, scheduler_output, *args, **kwargs)
        if sender is not None:
            sender.forward_done(start, time.monotonic(), scheduler_output)
            if out is not None:  # no sampling phase this step
                sender.send(0.0)
        return out

    def timed_sample_tokens(self, *args, **kwargs):
        start = time.monotonic()
        with _sample_profile():
            out = sample_tokens(self, *args, **kwargs)
        if sender is not None:
            sender.sampling_done(start, time.monotonic())
        return out

    runner_cls.execute_model = timed_execute_model
    runner_cls.sample_tokens = timed_sample_tokens
    setattr(runner_cls, _PATCHED_FLAG, True)


# Profiling in the engine core (`serve --profile-server`): the forward runs here, not in
# the server, so this process needs its own agent. It starts at the first step (after
# the fork: the agent must not be forked) and tags each step's samples with its phase
# and longest context.
_NO_PROFILE = nullcontext()
_profiling: bool | None = None
_last_tags: tuple[str, str] | None = None  # the forward's tags, reused for its sampler


def _step_profile(runner, scheduler_output):
    global _profiling, _last_tags
    if _profiling is None:
        _profiling = _start_engine_profiling(runner)
    if not _profiling:
        return _NO_PROFILE
    from serving.profiling import phase_tags, step_tags

    _last_tags = step_tags(scheduler_output)
    return phase_tags(*_last_tags)


def _sample_profile():
    if not _profiling or _last_tags is None:
        return _NO_PROFILE
    from serving.profiling import phase_tags

    return phase_tags(*_last_tags)


def _start_engine_profiling(runner) -> bool:
    from serving.profiling import (
        PROCESS_ENGINE,
        profiling_config_from,
        start_profiling,
        stop_profiling,
    )

    config = profiling_config_from()
    if config is None:
        return False
    try:
        name = getattr(runner.model_config, "served_model_name", None) or "model"
        start_profiling(config, str(name if isinstance(name, str) else name[0]),
                        process=PROCESS_ENGINE)
    except Exception:  # profiling must never break serving
        logging.getLogger("tailguard.profiling").exception("engine-core profiling off")
        return False
    atexit.register(stop_profiling)  # send the last profile
    return True


def register() -> None:
    """vLLM `general_plugins` entry point; may run several times per process."""
    path = settings.get(TAILGUARD_STEP_SOCKET)
    if not path and not settings.get(TAILGUARD_PROFILE_SERVER):
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, _PATCHED_FLAG, False):
        return
    _wrap(GPUModelRunner, StepSender(path) if path else None)
