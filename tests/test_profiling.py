"""Profiling: the pyroscope-io agent pushes tagged CPU profiles that a loopback
receiver decodes; off by default it costs nothing and never imports pyroscope.

The agent is native and process-wide, so every test that starts it runs in a child
process; the receiver stays in this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from observe.settings import TAILGUARD_PROFILE_SERVER as ENV_PROFILE_SERVER
from serving.profiling import (
    PHASE_DECODE,
    PHASE_MIXED,
    PHASE_PREFILL,
    ProfilingConfig,
    is_profiling,
    phase_tags,
    profiling_config_from,
    step_tags,
    stop_profiling,
)
from tests.pyroscope_receiver import PUSH_PATH, PyroscopeReceiver

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-llama"
BUSY_FUNCTION = "tailguard_busy_prefill"

AGENT_CHILD = textwrap.dedent("""
    import json, sys, threading, time
    from opentelemetry.sdk.trace import TracerProvider
    from serving.profiling import ProfilingConfig, phase_tags, start_profiling, stop_profiling

    def tailguard_busy_prefill():
        total = 0
        for i in range(100_000):
            total += i * i
        return total

    provider = TracerProvider()
    start_profiling(ProfilingConfig(sys.argv[1], upload_interval_s=1), sys.argv[2],
                    tracer_provider=provider)
    try:
        start_profiling(ProfilingConfig(sys.argv[1]), sys.argv[2])
        twice = "started"
    except RuntimeError:
        twice = "refused"
    tracer = provider.get_tracer("test")
    spans = {}

    def step():
        with tracer.start_as_current_span("llm.request") as root:
            with tracer.start_as_current_span("llm.prefill") as child:
                with phase_tags("prefill", "1k-4k"):  # 1 s of CPU, on a busy box too
                    cpu, end = time.thread_time() + 1.0, time.monotonic() + 20
                    while time.thread_time() < cpu and time.monotonic() < end:
                        tailguard_busy_prefill()
                    # The agent reads a sample's stack and the thread's tags at moments
                    # a few ms apart: a busy stack read just before the tag goes was
                    # once filed untagged. Idle (off CPU, unsampled) before it goes.
                    time.sleep(0.2)
        spans.update(root=dict(root.attributes), child=dict(child.attributes),
                     root_id=format(root.get_span_context().span_id, "016x"))

    thread = threading.Thread(target=step, name="engine-step")
    thread.start()
    thread.join()
    print(json.dumps({**spans, "twice": twice, "stopped": stop_profiling()}))
""")


def _python(code: str, *args: str, env: dict | None = None) -> str:
    env = {**(env or os.environ), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def pushed():
    """One agent run against a receiver: (receiver, what the child printed)."""
    with PyroscopeReceiver() as receiver:
        child = json.loads(_python(AGENT_CHILD, receiver.url, MODEL))
        receiver.wait_for(lambda rx: rx.samples(phase="prefill"), timeout_s=5)
        yield receiver, child


def test_the_agent_pushes_gzip_protobuf_to_the_push_endpoint_only(pushed):
    receiver, child = pushed
    assert receiver.pushes and receiver.refused == []
    assert {p.path for p in receiver.pushes} == {PUSH_PATH}
    assert {p.headers["content-encoding"] for p in receiver.pushes} == {"gzip"}
    assert {p.sample_types for p in receiver.pushes} == {("cpu/nanoseconds",)}
    assert child["stopped"] is True and child["twice"] == "refused"


def test_series_are_labelled_with_the_service_model_and_process(pushed):
    labels = pushed[0].pushes[0].labels
    assert {k: labels[k] for k in ("__name__", "service_name", "model", "process")} == {
        "__name__": "process_cpu", "service_name": "tailguard", "model": MODEL,
        "process": "server"}


def test_samples_inside_phase_tags_carry_phase_and_bucket_and_the_busy_stack(pushed):
    receiver, _ = pushed
    tagged = receiver.samples(phase="prefill", context_bucket="1k-4k")
    assert tagged and all("step" in s.stack for s in tagged)  # the tagged thread only
    busy = [s for s in tagged if s.stack[0] == BUSY_FUNCTION]
    assert sum(s.values[0] for s in busy) >= 0.5e9  # of its 1 s of CPU
    untagged = [s for p in receiver.pushes for s in p.samples if "phase" not in s.labels]
    assert not any(BUSY_FUNCTION in s.stack for s in untagged)


def test_root_spans_get_a_profile_id_that_tags_their_samples(pushed):
    receiver, child = pushed
    assert child["root"]["pyroscope.profile.id"] == child["root_id"]
    assert "pyroscope.profile.id" not in child["child"]
    linked = receiver.samples(span_id=child["root_id"], span_name="llm.request")
    # The span is current a little before and after its phase tag, so a busy machine
    # can sample it there: such samples carry the span but no phase.
    assert {s.labels.get("phase") for s in linked} - {None} == {"prefill"}


OFF_CHILD = textwrap.dedent("""
    import sys
    from serving.profiling import phase_tags, profiling_config_from
    assert profiling_config_from() is None
    with phase_tags("prefill", "0-1k"):
        pass
    print(sorted(m for m in sys.modules if m.startswith("pyroscope")))
""")


def test_profiling_is_off_by_default_and_never_imports_pyroscope():
    env = {k: v for k, v in os.environ.items() if k != ENV_PROFILE_SERVER}
    assert _python(OFF_CHILD, env=env) == "[]"


def test_phase_tags_off_is_one_shared_no_op():
    assert not is_profiling() and stop_profiling() is False
    assert phase_tags("decode", "0-1k") is phase_tags("prefill", "32k+")


@pytest.mark.parametrize("url, environ, expected", [
    ("http://a:4040", {}, "http://a:4040"),
    (None, {ENV_PROFILE_SERVER: "https://b"}, "https://b"),
    ("http://a:4040", {ENV_PROFILE_SERVER: "https://b"}, "http://a:4040"),
    (None, {ENV_PROFILE_SERVER: ""}, None),
    (None, {}, None),
], ids=["the argument is used", "the environment is the fallback",
        "the argument beats the environment", "an empty variable means off",
        "nothing means off"])
def test_config_resolves_argument_then_environment_then_off(url, environ, expected):
    config = profiling_config_from(url, environ)
    assert (config.server_url if config else None) == expected


@pytest.mark.parametrize("kwargs, field", [
    ({"server_url": "localhost:4040"}, "server_url"),
    ({"server_url": "grpc://host:4040"}, "server_url"),
    ({"server_url": "http://"}, "server_url"),
    ({"sample_rate": 0}, "sample_rate"),
    ({"sample_rate": 1001}, "sample_rate"),
    ({"sample_rate": 99.5}, "sample_rate"),
    ({"sample_rate": True}, "sample_rate"),
    ({"upload_interval_s": 0}, "upload_interval_s"),
    ({"application_name": ""}, "application_name"),
    ({"application_name": "tail guard"}, "application_name"),
    ({"tags": {"model": "x"}}, "tags"),
    ({"tags": {"span_id": "x"}}, "tags"),
    ({"tags": {"bad-key": "x"}}, "tags"),
    ({"tags": {"region": ""}}, "tags"),
], ids=["a URL needs a scheme", "only http and https are spoken", "a URL needs a host",
        "zero samples per second", "more than 1000 samples per second",
        "a fractional rate", "a boolean rate", "a zero upload interval",
        "an empty application name", "a name with a space",
        "a tag that shadows model", "a tag that shadows pyroscope-otel's",
        "a tag name with a dash", "an empty tag value"])
def test_config_refuses_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ProfilingConfig(**{"server_url": "http://127.0.0.1:4040", **kwargs})


def test_config_keeps_defaults_and_freezes_its_tags():
    tags = {"region": "eu"}
    config = ProfilingConfig("https://pyroscope.example:4040/prefix", tags=tags)
    tags["region"] = "us"
    assert (config.sample_rate, config.application_name, config.upload_interval_s,
            dict(config.tags)) == (100, "tailguard", 10, {"region": "eu"})
    with pytest.raises(TypeError):
        config.tags["region"] = "us"


def _scheduled(new: dict, cached: dict, spec: dict | None = None):
    """A SchedulerOutput stand-in: {req_id: (computed, scheduled)} per kind."""
    return SimpleNamespace(
        num_scheduled_tokens={r: s for r, (_, s) in {**new, **cached}.items()},
        scheduled_spec_decode_tokens=spec or {},
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c)
                            for r, (c, _) in new.items()],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(cached), num_computed_tokens=[c for c, _ in cached.values()]))


@pytest.mark.parametrize("new, cached, spec, expected", [
    ({"a": (0, 2000)}, {}, None, (PHASE_PREFILL, "1k-4k")),
    ({}, {"a": (300, 1), "b": (5000, 1)}, None, (PHASE_DECODE, "4k-32k")),
    ({"a": (0, 512)}, {"b": (40000, 1)}, None, (PHASE_MIXED, "32k+")),
    ({}, {"a": (3000, 2048)}, None, (PHASE_PREFILL, "4k-32k")),
    ({}, {"a": (100, 4)}, {"a": [7, 8, 9]}, (PHASE_DECODE, "0-1k")),
], ids=["a new prompt is prefill", "one token each is decode",
        "a prompt beside a decode is mixed", "a chunked prefill continues as prefill",
        "speculative tokens are still decode"])
def test_step_tags_classify_the_step_and_bucket_its_longest_context(new, cached, spec,
                                                                    expected):
    assert step_tags(_scheduled(new, cached, spec)) == expected
