"""Every environment variable tailguard reads or writes, and the only module that
touches `os.environ`.

As in the OpenTelemetry SDK (`opentelemetry.sdk.environment_variables`), each name is
a documented constant; a component resolves argument -> environment variable ->
default where it is configured, reading the variable through the getters below. The
writers at the end are what the server needs to hand variables to the processes it
starts. Stdlib only: vLLM's engine processes import this (serving/engine/step_plugin).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

# --- the server (serving/config.py) ------------------------------------------------
TAILGUARD_DB: Final = "TAILGUARD_DB"  # trace-log file; default tailguard.duckdb
TAILGUARD_ADMIN_TOKEN: Final = "TAILGUARD_ADMIN_TOKEN"  # else a token file (serving/admin/auth)
TAILGUARD_TRACE_FLUSH_S: Final = "TAILGUARD_TRACE_FLUSH_S"  # seconds; default 1.0
TAILGUARD_HISTOGRAM_BUCKETS: Final = "TAILGUARD_HISTOGRAM_BUCKETS"  # fine (default) or slo
TAILGUARD_NATIVE_HISTOGRAMS: Final = "TAILGUARD_NATIVE_HISTOGRAMS"  # 1: also native; default 0
TAILGUARD_PATH_PROFILE: Final = "TAILGUARD_PATH_PROFILE"  # seed 001's hot or cold; default neither
TAILGUARD_TRACE_MEMORY: Final = "TAILGUARD_TRACE_MEMORY"  # DuckDB memory limit; default 512MB
TAILGUARD_MAX_BODY_BYTES: Final = "TAILGUARD_MAX_BODY_BYTES"  # default 4 MiB
TAILGUARD_MAX_N: Final = "TAILGUARD_MAX_N"  # completions per prompt; default 8
TAILGUARD_MAX_SEQUENCES: Final = "TAILGUARD_MAX_SEQUENCES"  # per request; default 64
TAILGUARD_MAX_CLIENT_SEQUENCES: Final = "TAILGUARD_MAX_CLIENT_SEQUENCES"  # default 128; 0: off
TAILGUARD_STREAM_WRITE_TIMEOUT_S: Final = "TAILGUARD_STREAM_WRITE_TIMEOUT_S"  # default 30
TAILGUARD_MODEL_DIR: Final = "TAILGUARD_MODEL_DIR"  # trained models; default beside the DB
TAILGUARD_RETRAIN_S: Final = "TAILGUARD_RETRAIN_S"  # default 600; 0: never
TAILGUARD_FORECAST_RESELECT_S: Final = "TAILGUARD_FORECAST_RESELECT_S"  # default 1800; 0: never
TAILGUARD_FORWARDED_ALLOW_IPS: Final = "TAILGUARD_FORWARDED_ALLOW_IPS"  # default: no proxy
TAILGUARD_HTTP_HEADER_TIMEOUT_S: Final = "TAILGUARD_HTTP_HEADER_TIMEOUT_S"  # default 10
TAILGUARD_HTTP_BODY_TIMEOUT_S: Final = "TAILGUARD_HTTP_BODY_TIMEOUT_S"  # default 30
TAILGUARD_HTTP_KEEP_ALIVE_S: Final = "TAILGUARD_HTTP_KEEP_ALIVE_S"  # default 5
TAILGUARD_HTTP_MAX_CONNECTIONS: Final = "TAILGUARD_HTTP_MAX_CONNECTIONS"  # default: from ulimit
TAILGUARD_ADMIN_QUERY_SLOTS: Final = "TAILGUARD_ADMIN_QUERY_SLOTS"  # /admin/query at once; 2
TAILGUARD_PROFILE_SERVER: Final = "TAILGUARD_PROFILE_SERVER"  # Pyroscope URL; default: off

# --- the engine (serving/engine/) --------------------------------------------------
TAILGUARD_ENGINE_HANG_S: Final = "TAILGUARD_ENGINE_HANG_S"  # watchdog; default 60; 0: off
TAILGUARD_STEP_SOCKET: Final = "TAILGUARD_STEP_SOCKET"  # set by the server for the engine
TAILGUARD_TCMALLOC: Final = "TAILGUARD_TCMALLOC"  # 0/false/no/off: no re-exec with tcmalloc
TAILGUARD_HOME: Final = "TAILGUARD_HOME"  # the embedded model's cache; ~/.cache/tailguard

# --- the console (dashboards/console/), set by `tailguard up` and `tailguard console` ---
TAILGUARD_URL: Final = "TAILGUARD_URL"  # the server; default http://127.0.0.1:8000
TAILGUARD_ADMIN_TOKEN_FILE: Final = "TAILGUARD_ADMIN_TOKEN_FILE"  # when the token is unset
TAILGUARD_CONSOLE_DB: Final = "TAILGUARD_CONSOLE_DB"  # no server: read this trace file
TAILGUARD_CONSOLE_SLO: Final = "TAILGUARD_CONSOLE_SLO"  # with it, this SLO spec
TAILGUARD_CONSOLE_REFRESH_S: Final = "TAILGUARD_CONSOLE_REFRESH_S"  # default 5; 0: off
TAILGUARD_CONSOLE_HOST: Final = "TAILGUARD_CONSOLE_HOST"  # its address, if Streamlit's is unset
TAILGUARD_CONSOLE_AUTH: Final = "TAILGUARD_CONSOLE_AUTH"  # auto (login off loopback) | always

# --- foreign: the OpenTelemetry SDK's own names (observe/otlp.py) -------------------
OTEL_EXPORTER_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"  # default: export off
OTEL_EXPORTER_OTLP_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"  # default http/protobuf
OTEL_EXPORTER_OTLP_HEADERS: Final = "OTEL_EXPORTER_OTLP_HEADERS"  # "k=v,k2=v2", URL-encoded
OTEL_METRIC_EXPORT_INTERVAL: Final = "OTEL_METRIC_EXPORT_INTERVAL"  # milliseconds; 15000

# --- foreign: read or defaulted for vLLM, torch and the loader (serving/engine/) -----
VLLM_WORKER_MULTIPROC_METHOD: Final = "VLLM_WORKER_MULTIPROC_METHOD"  # spawn: fork server
VLLM_CPU_KVCACHE_SPACE: Final = "VLLM_CPU_KVCACHE_SPACE"  # GiB; defaulted to 1
TORCH_COMPILE_DISABLE: Final = "TORCH_COMPILE_DISABLE"  # defaulted to 1 with --enforce-eager
PYTHONPATH: Final = "PYTHONPATH"  # the latency model's fit process: our packages first
ONEDNN_PRIMITIVE_CACHE_CAPACITY: Final = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"  # defaulted to 0
LD_PRELOAD: Final = "LD_PRELOAD"  # tcmalloc goes first

NOT_VALID: Final = "environment variable {name}={raw!r} is not a valid {kind}"
_OFF_WORDS: Final = ("0", "false", "no", "off")
N = TypeVar("N", int, float)

log = logging.getLogger("tailguard")


# --- reading ---------------------------------------------------------------------
def get(name: str, default: str | None = None,
        environ: Mapping[str, str] | None = None) -> str | None:
    """The variable as set (an empty value included), else `default`. `environ`: a
    child's environment to read instead of this process's."""
    return (os.environ if environ is None else environ).get(name, default)


def text(name: str, default: str | None = None) -> str | None:
    """The variable, or `default` when it is unset or empty."""
    return os.environ.get(name) or default


def is_set(name: str) -> bool:
    """Set at all, even to "" (an empty admin token is a mistake, not an absence)."""
    return name in os.environ


def flag(name: str, default: bool = True, environ: Mapping[str, str] | None = None) -> bool:
    """False for 0/false/no/off (any case, blanks around), True for any other value."""
    raw = get(name, None, environ)
    return default if raw is None else raw.strip().lower() not in _OFF_WORDS


def number(name: str, default: N, cast: Callable[[str], N] = float, *,
           complaint: str = NOT_VALID, blank_is_unset: bool = True) -> N:
    """The variable as a number; `default` when unset (or empty, unless
    `blank_is_unset` is False). ValueError, `complaint` filled with name, raw and
    kind, when it is not one: a typo must stop the server, not be ignored."""
    raw = os.environ.get(name)
    if raw is None or (raw == "" and blank_is_unset):
        return default
    try:
        return cast(raw)
    except ValueError:
        raise ValueError(complaint.format(name=name, raw=raw, kind=cast.__name__)) from None


def number_or_default(name: str, default: N, cast: Callable[[str], N] = float,
                      valid: Callable[[N], bool] = lambda value: True,
                      want: str | None = None) -> N:
    """The variable as a number; `default` when unset, blank, not a number or not
    `valid`. With `want`, a refused value is logged as a warning saying what is wanted."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        value = None
    if value is not None and valid(value):
        return value
    if want:
        log.warning("ignoring %s=%r (want %s)", name, raw, want)
    return default


# --- writing: what the server hands to the processes it starts --------------------
def snapshot() -> dict[str, str]:
    """A copy of this process's whole environment."""
    return dict(os.environ)


def child_environ(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child process's environment: this one's, with `overrides` on top."""
    return {**os.environ, **(overrides or {})}


def export(name: str, value: str) -> None:
    """Set a variable for this process and every process it starts from now on."""
    os.environ[name] = value


def withdraw(name: str, value: str) -> None:
    """Unset `name` if it still holds `value` (someone else's later value stays)."""
    if os.environ.get(name) == value:
        del os.environ[name]


def set_defaults(defaults: Mapping[str, str]) -> None:
    """Set each variable that is not set yet: an operator's own value wins."""
    for name, value in defaults.items():
        os.environ.setdefault(name, value)


def replace_all(environ: Mapping[str, str]) -> None:
    """Make this process's environment exactly `environ`, writing only what differs
    (a forked engine core taking its parent's environment)."""
    for name in set(os.environ) - set(environ):
        del os.environ[name]
    for name, value in environ.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
