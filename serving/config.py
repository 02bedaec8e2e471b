"""Server configuration: one slotted dataclass, checked on construction.

Each setting resolves argument -> environment variable -> default; the variables
are named in observe/settings.py, which reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from observe import settings as S
from observe.archive import ArchiveConfig, instance_name
from observe.otlp import OtlpConfig, otlp_config_from
from serving.http_limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    HttpLimits,
    default_max_connections,
)
from serving.keys import KeyRing, load_keys
from serving.profiling import ProfilingConfig, profiling_config_from
from slo import model_files
from slo.durations import parse_duration
from slo.histogram_bounds import latency_buckets
from slo.loading import load_spec
from slo.policy.conditions import PolicyConfig
from slo.spec import SLOSpec

DEFAULT_DB = "tailguard.duckdb"
DEFAULT_MAX_BODY = 4 * 1024 * 1024
DEFAULT_MAX_N = 8
DEFAULT_MAX_SEQUENCES = 64  # prompts x n of one request
DEFAULT_MAX_CLIENT_SEQUENCES = 128  # in flight per client; 0: no per-client bound
DEFAULT_WRITE_TIMEOUT_S = 30.0  # one stream write; a client reading nothing is cut
DEFAULT_RETRAIN_S = 600.0
DEFAULT_RESELECT_S = 1800.0
# Seed 001's hot and cold paths, one instance each behind an L7 proxy that routes by
# tier (docs/deployment.md): the policy settings each starts from (a policies file
# replaces any of them) and vLLM's batch bound (an explicit --max-num-seqs after `--`
# wins). Hot: batches of at most 4, no request waits over 500 ms for the engine. Cold:
# batches of 16, at most 64 waiting.
PATH_PROFILES = {
    "hot": ({"batch_floor": 4, "batch_initial": 4, "batch_cap": 4, "queue_wait_s": 0.5}, 4),
    "cold": ({"batch_floor": 8, "batch_initial": 16, "batch_cap": 16, "max_queue": 64}, 16),
}


@dataclass(slots=True)
class ServerConfig:
    model: str  # a local Hugging Face model directory
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    db: str | None = None
    admin_token_file: str | None = None
    flush_interval_s: float | None = None
    histogram_buckets: str | None = None  # latency histogram bounds: fine or slo
    native_histograms: bool | None = None  # latency histograms also native; None: env, off
    max_body_bytes: int | None = None
    max_n: int | None = None
    max_sequences: int | None = None
    max_client_sequences: int | None = None
    stream_write_timeout_s: float | None = None
    slo_file: str | None = None
    model_dir: str | None = None  # trained predictor/forecaster; default beside the DB
    retrain_interval_s: float | None = None  # 0 turns retraining off
    reselect_interval_s: float | None = None  # memory-forecaster backtests; 0: never
    keys_file: str | None = None  # API keys -> tiers; without it every client is realtime
    policy_file: str | None = None  # YAML of PolicyConfig fields overriding SPEC defaults
    path_profile: str | None = None  # seed 001's hot or cold path (PATH_PROFILES); None: neither
    enable_fault_injection: bool = False  # PUT /admin/faults (tests, drills)
    forwarded_allow_ips: str | None = None  # proxies whose X-Forwarded-For counts; None: none
    http_limits: HttpLimits | None = None  # connection deadlines and cap; None: env, defaults
    otlp_endpoint: str | None = None  # OTLP collector; else $OTEL_EXPORTER_OTLP_ENDPOINT
    otlp_protocol: str | None = None  # http/protobuf (default) or grpc
    otlp: OtlpConfig | None = field(init=False)
    archive_dir: str | None = None  # Parquet archive (observe.archive); None: off
    archive_after: str | None = None  # retention in the DB, e.g. "30d"
    archive_interval_s: float = 3600.0
    instance: str | None = None  # this server's name in the archive
    archive: ArchiveConfig | None = field(init=False)
    profile_server: str | None = None  # Pyroscope; else $TAILGUARD_PROFILE_SERVER
    profiling: ProfilingConfig | None = field(init=False)
    policies: PolicyConfig = field(init=False)
    keys: KeyRing = field(init=False)
    vllm_args: list[str] = field(default_factory=list)
    spec: SLOSpec = field(init=False)
    latency_buckets: dict = field(init=False)  # histogram -> bounds (slo.histogram_bounds)

    def __post_init__(self) -> None:
        self.spec = load_spec(self.slo_file)  # SpecError (a ValueError) names field + line
        self._apply_path_profile()
        self.keys = load_keys(self.keys_file) if self.keys_file else KeyRing.open()
        if self.otlp_protocol and not (self.otlp_endpoint
                                       or S.get(S.OTEL_EXPORTER_OTLP_ENDPOINT)):
            raise ValueError("--otlp-protocol needs --otlp-endpoint")
        self.otlp = otlp_config_from(self.otlp_endpoint, self.otlp_protocol)
        self.archive = self._archive_config()
        self.profiling = profiling_config_from(self.profile_server)
        self.forwarded_allow_ips = (self.forwarded_allow_ips
                                    or S.text(S.TAILGUARD_FORWARDED_ALLOW_IPS))
        self.http_limits = self.http_limits or http_limits_from_env()
        self.db = self.db or S.text(S.TAILGUARD_DB, DEFAULT_DB)
        self.flush_interval_s = self.flush_interval_s or S.number(S.TAILGUARD_TRACE_FLUSH_S, 1.0)
        self.histogram_buckets = self.histogram_buckets or S.text(
            S.TAILGUARD_HISTOGRAM_BUCKETS, "fine")
        self.latency_buckets = latency_buckets(self.spec, self.histogram_buckets)
        self._resolve_native_histograms()
        self.max_body_bytes = self.max_body_bytes or S.number(S.TAILGUARD_MAX_BODY_BYTES,
                                                              DEFAULT_MAX_BODY, int)
        self.max_n = self.max_n or S.number(S.TAILGUARD_MAX_N, DEFAULT_MAX_N, int)
        self._resolve_client_bounds()
        self.model_dir = self.model_dir or S.text(S.TAILGUARD_MODEL_DIR,
                                                  str(model_files.default_dir(self.db)))
        if self.retrain_interval_s is None:
            self.retrain_interval_s = S.number(S.TAILGUARD_RETRAIN_S, DEFAULT_RETRAIN_S)
        if self.reselect_interval_s is None:
            self.reselect_interval_s = S.number(S.TAILGUARD_FORECAST_RESELECT_S,
                                                DEFAULT_RESELECT_S)
        if not Path(self.model, "config.json").is_file():
            raise ValueError(f"model: {self.model} is not a Hugging Face model directory "
                             "(no config.json)")
        if not 0 < self.port < 65536:
            raise ValueError(f"port: {self.port} is not a TCP port")
        if not 0 < self.flush_interval_s <= 60:
            raise ValueError("flush_interval_s must be in (0, 60]")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be at least 1024")
        if self.max_n < 1:
            raise ValueError("max_n must be at least 1")
        if self.retrain_interval_s < 0 or self.reselect_interval_s < 0:
            raise ValueError("retrain and reselect intervals must be >= 0 (0: never)")

    def _resolve_native_histograms(self) -> None:
        if self.native_histograms is None:
            self.native_histograms = S.flag(S.TAILGUARD_NATIVE_HISTOGRAMS, default=False)
        if self.native_histograms and self.otlp:  # the SDK's exporter has no native kind
            raise ValueError("--native-histograms needs Prometheus as the only metrics "
                             "reader (OTLP export is on)")

    def _apply_path_profile(self) -> None:
        """The policies (the profile's settings under the file's) and vLLM's batch bound."""
        self.path_profile = self.path_profile or S.text(S.TAILGUARD_PATH_PROFILE)
        if self.path_profile and self.path_profile not in PATH_PROFILES:
            raise ValueError(f"path_profile must be one of {', '.join(PATH_PROFILES)}, "
                             f"not {self.path_profile!r}")
        base, max_seqs = PATH_PROFILES.get(self.path_profile, ({}, None))
        self.policies = load_policy_config(self.policy_file, base)
        named = any(a == "--max-num-seqs" or a.startswith("--max-num-seqs=")
                    for a in self.vllm_args)
        if max_seqs and not named:
            self.vllm_args = [*self.vllm_args, "--max-num-seqs", str(max_seqs)]

    def _resolve_client_bounds(self) -> None:
        """What one request and one client may hold: sequences, and a stream's writes."""
        self.max_sequences = self.max_sequences or S.number(S.TAILGUARD_MAX_SEQUENCES,
                                                            DEFAULT_MAX_SEQUENCES, int)
        if self.max_client_sequences is None:
            self.max_client_sequences = S.number(S.TAILGUARD_MAX_CLIENT_SEQUENCES,
                                                 DEFAULT_MAX_CLIENT_SEQUENCES, int)
        self.stream_write_timeout_s = self.stream_write_timeout_s or S.number(
            S.TAILGUARD_STREAM_WRITE_TIMEOUT_S, DEFAULT_WRITE_TIMEOUT_S)
        if self.max_sequences < 1 or self.max_client_sequences < 0:
            raise ValueError("max_sequences must be >= 1 and max_client_sequences >= 0")
        if not 0 < self.stream_write_timeout_s <= 3600:
            raise ValueError("stream_write_timeout_s must be in (0, 3600]")

    def _archive_config(self) -> ArchiveConfig | None:
        """Retention defaults to the longest SLO window: the budget math reads the DB."""
        if not self.archive_dir:
            if self.archive_after or self.instance:
                raise ValueError("--archive-after and --instance go with --archive-dir")
            return None
        longest = max(slo.window_s for slo in self.spec.slos)
        retention = parse_duration(self.archive_after) if self.archive_after else longest
        name = instance_name(self.instance or f"{self.host}:{self.port}")
        return ArchiveConfig(self.archive_dir, name, retention, self.archive_interval_s)

    @property
    def predictor_path(self) -> Path:
        return Path(self.model_dir, model_files.LATENCY_FILE)

    @property
    def forecaster_path(self) -> Path:
        return Path(self.model_dir, model_files.FORECAST_FILE)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def http_limits_from_env() -> HttpLimits:
    """Connection deadlines and cap (serving.http_limits), each from its variable."""
    return HttpLimits(
        header_timeout_s=S.number(S.TAILGUARD_HTTP_HEADER_TIMEOUT_S, DEFAULT_HEADER_TIMEOUT_S),
        body_timeout_s=S.number(S.TAILGUARD_HTTP_BODY_TIMEOUT_S, DEFAULT_BODY_TIMEOUT_S),
        keep_alive_s=S.number(S.TAILGUARD_HTTP_KEEP_ALIVE_S, DEFAULT_KEEP_ALIVE_S),
        max_connections=S.number(S.TAILGUARD_HTTP_MAX_CONNECTIONS, default_max_connections(),
                                 int))


def load_policy_config(path: str | None, base: dict | None = None) -> PolicyConfig:
    """SPEC §3 defaults, replaced by `base` (a path profile's), then by any field set in
    the YAML file."""
    base = base or {}
    if not path:
        return PolicyConfig(**base)
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"policy config {path}: {' '.join(str(exc).split())}") from None
    known = set(PolicyConfig.__dataclass_fields__)
    unknown = sorted(set(data) - known) if isinstance(data, dict) else ["(not a mapping)"]
    if unknown:
        raise ValueError(f"policy config {path}: unknown field(s) {', '.join(map(str, unknown))}")
    try:
        return PolicyConfig(**{**base, **data})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy config {path}: {exc}") from None
