"""Continuous CPU profiling with Pyroscope; off unless a server URL is given.

`--profile-server URL` (or `TAILGUARD_PROFILE_SERVER`) starts the pyroscope-io agent:
a Rust sampler (py-spy) reading this process's Python stacks `sample_rate` times a
second (on-CPU, GIL-holding threads only: the agent's defaults) and pushing them
every `upload_interval_s` to `URL/push.v1.PusherService/Push`. Series tags: `model`,
`process`; per-thread tags: `phase` and `context_bucket` while an engine step runs
inside `phase_tags`, and pyroscope-otel's `span_id`/`span_name`/`trace_id` while a
root span is open on the thread (the span gets `pyroscope.profile.id`).

The agent only sees its own process: the engine core (a child process under AsyncLLM)
needs its own `start_profiling`, made there. Forking after the agent starts may
deadlock the child, so start it only after the engine core process exists.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final
from urllib.parse import urlsplit

from observe import registry as R
from observe import settings
from observe.settings import TAILGUARD_PROFILE_SERVER

DEFAULT_APPLICATION: Final = "tailguard"
# Profile tags (proposed for observe/registry.py).
TAG_MODEL: Final = "model"
TAG_PROCESS: Final = "process"  # PROCESS_SERVER or PROCESS_ENGINE
TAG_PHASE: Final = "phase"  # one of PHASES
TAG_CONTEXT_BUCKET: Final = R.LABEL_CONTEXT_BUCKET  # the step's longest context
PROCESS_SERVER: Final = "server"
PROCESS_ENGINE: Final = "engine_core"
PHASE_PREFILL: Final = "prefill"  # every request of the step is prefilling
PHASE_DECODE: Final = "decode"  # every request of the step is decoding
PHASE_MIXED: Final = "mixed"  # both (chunked prefill next to decodes)
PHASES: Final = (PHASE_PREFILL, PHASE_DECODE, PHASE_MIXED)
# Set by the agent or pyroscope-otel; a user tag must not shadow them.
RESERVED_TAGS: Final = frozenset({TAG_MODEL, TAG_PROCESS, TAG_PHASE, TAG_CONTEXT_BUCKET,
                                  "service_name", "__name__", "span_id", "span_name",
                                  "trace_id"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_TAG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True, slots=True)
class ProfilingConfig:
    server_url: str  # http(s)://host[:port][/prefix] of a Pyroscope server
    sample_rate: int = 100  # stack samples per second
    application_name: str = DEFAULT_APPLICATION  # the profiles' service_name
    upload_interval_s: int = 10
    tags: Mapping[str, str] = field(default_factory=dict)  # extra series tags

    def __post_init__(self) -> None:
        url = urlsplit(self.server_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server_url: expected http(s)://host[:port], got {self.server_url!r}")
        for name, value, top in (("sample_rate", self.sample_rate, 1000),
                                 ("upload_interval_s", self.upload_interval_s, 3600)):
            if type(value) is not int or not 1 <= value <= top:
                raise ValueError(f"{name}: expected an integer in [1, {top}], got {value!r}")
        if not _NAME.fullmatch(self.application_name):
            raise ValueError(f"application_name: expected [A-Za-z0-9_.-]+, "
                             f"got {self.application_name!r}")
        for key, value in dict(self.tags).items():
            if not _TAG_KEY.fullmatch(key) or key in RESERVED_TAGS:
                raise ValueError(f"tags: invalid or reserved tag name {key!r}")
            if not isinstance(value, str) or not value:
                raise ValueError(f"tags: value of {key!r} must be a non-empty string")
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))


def profiling_config_from(url: str | None = None,
                          environ: Mapping[str, str] | None = None) -> ProfilingConfig | None:
    """`url` -> $TAILGUARD_PROFILE_SERVER (in `environ`, else this process's) -> None
    (profiling off)."""
    url = url or settings.get(TAILGUARD_PROFILE_SERVER, None, environ) or None
    return ProfilingConfig(url) if url else None


_tag_wrapper = None  # pyroscope.tag_wrapper while the agent runs in this process
_OFF = nullcontext()
_linked: weakref.WeakSet = weakref.WeakSet()  # tracer providers given the span processor


def is_profiling() -> bool:
    return _tag_wrapper is not None


def start_profiling(config: ProfilingConfig, model_name: str, tracer_provider=None,
                    process: str = PROCESS_SERVER) -> None:
    """Start the agent in this process; link root spans of `tracer_provider` to it."""
    global _tag_wrapper
    if _tag_wrapper is not None:
        raise RuntimeError("profiling is already running in this process")
    import pyroscope

    tags = {**config.tags, TAG_MODEL: model_name, TAG_PROCESS: process}
    if not pyroscope.configure(application_name=config.application_name,
                               server_address=config.server_url, tags=tags,
                               sample_rate=config.sample_rate,
                               upload_interval=config.upload_interval_s):
        raise RuntimeError("the pyroscope agent refused to start (already configured?)")
    _tag_wrapper = pyroscope.tag_wrapper
    if tracer_provider is not None and tracer_provider not in _linked:
        from pyroscope.otel import PyroscopeSpanProcessor

        _linked.add(tracer_provider)  # a provider cannot drop a processor: add it once
        tracer_provider.add_span_processor(PyroscopeSpanProcessor())


def stop_profiling() -> bool:
    """Flush the last profile and stop the agent; False when it was not running."""
    global _tag_wrapper
    if _tag_wrapper is None:
        return False
    import pyroscope

    _tag_wrapper = None
    return bool(pyroscope.shutdown())


def phase_tags(phase: str, context_bucket: str):
    """Tag this thread's samples for the block; a shared no-op while profiling is off.
    pyroscope-io adds and removes the tags one at a time, so the odd sample at the
    block's edges carries only one of the two."""
    wrapper = _tag_wrapper
    if wrapper is None:
        return _OFF
    return wrapper({TAG_PHASE: phase, TAG_CONTEXT_BUCKET: context_bucket})


def step_tags(scheduler_output) -> tuple[str, str]:
    """(phase, context bucket of the longest context) of a vLLM `SchedulerOutput`.

    A request is prefilling when it is scheduled more tokens than one plus its
    speculative tokens; its context is its computed tokens plus the scheduled ones."""
    scheduled = scheduler_output.num_scheduled_tokens
    spec = scheduler_output.scheduled_spec_decode_tokens
    computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens))
    prefill = decode = longest = 0
    for req_id, tokens in scheduled.items():
        if tokens > 1 + len(spec.get(req_id, ())):
            prefill += 1
        else:
            decode += 1
        longest = max(longest, computed.get(req_id, 0) + tokens)
    phase = PHASE_MIXED if prefill and decode else PHASE_PREFILL if prefill else PHASE_DECODE
    return phase, R.context_bucket(longest)
