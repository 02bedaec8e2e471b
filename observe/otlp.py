"""OTLP export of spans and metrics to any OpenTelemetry collector.

`otlp_config_from()` resolves argument -> standard OTel environment variable ->
off (None). The factories plug into the server's providers beside the trace log
and the Prometheus reader:

    provider.add_span_processor(create_otlp_span_processor(config))
    MeterProvider(metric_readers=[prometheus_reader, create_otlp_metric_reader(config)])

The exporter packages are imported only inside the factories, so `observe/` imports
without them. Exports run on the SDK's background threads; a failed export is logged
and dropped, never raised into the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from observe import settings
from observe.settings import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_HEADERS,
    OTEL_EXPORTER_OTLP_PROTOCOL,
    OTEL_METRIC_EXPORT_INTERVAL,
)

PROTOCOL_HTTP: Final = "http/protobuf"
PROTOCOL_GRPC: Final = "grpc"
PROTOCOLS: Final = (PROTOCOL_HTTP, PROTOCOL_GRPC)

# OTLP/HTTP signal paths, appended to the endpoint (which may carry a path prefix).
TRACES_PATH: Final = "/v1/traces"
METRICS_PATH: Final = "/v1/metrics"

DEFAULT_PROTOCOL: Final = PROTOCOL_HTTP
DEFAULT_EXPORT_INTERVAL_S: Final = 15.0  # a typical Prometheus scrape interval
DEFAULT_TIMEOUT_S: Final = 10.0  # per export, retries included (the SDK's default)

_INSTALL_HINT = "pip install opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-grpc"


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """Where and how to send OTLP. `endpoint` is the collector's base URL,
    e.g. http://localhost:4318 (http/protobuf) or http://localhost:4317 (grpc)."""

    endpoint: str
    protocol: str = DEFAULT_PROTOCOL
    headers: tuple[tuple[str, str], ...] = ()  # sent with every export (e.g. auth); or a dict
    export_interval_s: float = DEFAULT_EXPORT_INTERVAL_S  # metrics only
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"OTLP protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        _check_endpoint(self.endpoint, self.protocol)
        for name in ("export_interval_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OtlpConfig.{name} must be > 0, got {getattr(self, name)!r}")
        object.__setattr__(self, "headers", _pairs(self.headers))
        object.__setattr__(self, "endpoint", self.endpoint.rstrip("/"))

    @property
    def insecure(self) -> bool:
        return self.endpoint.startswith("http://")

    @property
    def grpc_target(self) -> str:
        """host:port, as gRPC dials it."""
        return urlsplit(self.endpoint).netloc


def _check_endpoint(endpoint: str, protocol: str) -> None:
    example = "http://localhost:4317" if protocol == PROTOCOL_GRPC else "http://localhost:4318"
    bad = f"OTLP endpoint {endpoint!r} is not an http(s)://host:port URL (e.g. {example})"
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(bad)
    try:
        parts.port  # raises on a non-numeric or out-of-range port
    except ValueError:
        raise ValueError(f"{bad}: bad port") from None
    if protocol == PROTOCOL_GRPC and parts.path.strip("/"):
        raise ValueError(f"{bad}: a gRPC endpoint takes no path")


def otlp_config_from(endpoint: str | None = None, protocol: str | None = None) -> OtlpConfig | None:
    """The OTLP config from the arguments, else the standard environment variables;
    None (export off) when neither names an endpoint."""
    endpoint = endpoint or settings.get(OTEL_EXPORTER_OTLP_ENDPOINT)
    if not endpoint:
        return None
    protocol = protocol or settings.text(OTEL_EXPORTER_OTLP_PROTOCOL, DEFAULT_PROTOCOL)
    return OtlpConfig(endpoint, protocol, headers=_env_headers(),
                      export_interval_s=_env_interval_s())


def _env_headers() -> tuple[tuple[str, str], ...]:
    from opentelemetry.util.re import parse_env_headers

    raw = settings.get(OTEL_EXPORTER_OTLP_HEADERS, "")
    return tuple(parse_env_headers(raw, liberal=True).items())


def _env_interval_s() -> float:
    milliseconds = settings.number(
        OTEL_METRIC_EXPORT_INTERVAL, DEFAULT_EXPORT_INTERVAL_S * 1000,
        complaint="environment variable {name}={raw!r} is not a number of milliseconds")
    return milliseconds / 1000


def create_otlp_span_processor(config: OtlpConfig):
    """A BatchSpanProcessor that sends finished spans to the collector."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter = _exporter(config, "trace_exporter", "OTLPSpanExporter", TRACES_PATH)
    return BatchSpanProcessor(exporter, export_timeout_millis=config.timeout_s * 1000)


def create_otlp_metric_reader(config: OtlpConfig):
    """A reader that pushes every instrument (cumulative) each `export_interval_s`."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    exporter = _exporter(config, "metric_exporter", "OTLPMetricExporter", METRICS_PATH)
    return PeriodicExportingMetricReader(
        exporter, export_interval_millis=config.export_interval_s * 1000,
        export_timeout_millis=config.timeout_s * 1000)


def _exporter(config: OtlpConfig, module: str, cls: str, path: str):
    """The OTLP exporter class `cls` of the config's protocol, imported here."""
    import importlib

    transport = "grpc" if config.protocol == PROTOCOL_GRPC else "http"
    try:
        mod = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{transport}.{module}")
    except ImportError as exc:
        raise ImportError(f"OTLP export over {config.protocol} needs the OTLP exporters "
                          f"({_INSTALL_HINT}): {exc}") from exc
    headers = dict(config.headers) or None
    if transport == "grpc":
        return getattr(mod, cls)(endpoint=config.grpc_target, insecure=config.insecure,
                                 headers=headers, timeout=config.timeout_s)
    return getattr(mod, cls)(endpoint=config.endpoint + path, headers=headers,
                             timeout=config.timeout_s)


def _pairs(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Header pairs with lower-case names: gRPC metadata refuses upper case."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(k).lower(), str(v)) for k, v in items)
