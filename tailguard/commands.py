"""Command bodies: parse, then call library code."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

import click

from tailguard.clitools import TraceSource, one_line

EMBEDDED_NAME = "tailguard-tiny-llama"


@click.group()
def model():
    """The embedded tiny model."""


@model.command("init")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
def model_init(directory):
    """Build the embedded tiny Llama offline (cached) and print its path.

    Example: tailguard model init ./tiny-model
    """
    from serving.engine.embedded_model import ensure_model

    click.echo(str(ensure_model(directory)))


# Each option's parameter is named after the ServerConfig field it sets, so the options
# map onto the config in one step (tests/test_cli.py holds every name to a field).
@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--model", type=click.Path(exists=True, file_okay=False),
              help="Local Hugging Face model directory (default: the embedded model).")
@click.option("--served-model-name", help="Name clients use for the model.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--db", help="Trace-log DuckDB file (default: $TAILGUARD_DB or tailguard.duckdb).")
@click.option("--admin-token-file", type=click.Path(dir_okay=False),
              help="Admin token file (default: $TAILGUARD_ADMIN_TOKEN, else generated).")
@click.option("--flush-interval", "flush_interval_s", type=click.FloatRange(0.01, 60), help="Trace flush period, s.")
@click.option("--histogram-buckets", type=click.Choice(["fine", "slo"]),
              help="Latency histogram bounds: fine (213, a 10 ms-resolution P99) or slo "
                   "(<= 40: one at every SLO target, log-spaced elsewhere; about a "
                   "quarter of the series). Default: $TAILGUARD_HISTOGRAM_BUCKETS or fine.")
@click.option("--native-histograms/--no-native-histograms", default=None,
              help="Latency histograms also as Prometheus native (exponential) ones, for a "
                   "Prometheus with --enable-feature=native-histograms: one series each. "
                   "Default: $TAILGUARD_NATIVE_HISTOGRAMS or off.")
@click.option("--slo", "slo_file", type=click.Path(dir_okay=False),
              help="SLO spec YAML (default: the one shipped with tailguard).")
@click.option("--model-dir", type=click.Path(file_okay=False),
              help="Where the trained latency/memory models live (default: DB + '.models').")
@click.option("--retrain-interval", "retrain_interval_s", type=click.FloatRange(min=0),
              help="Seconds between latency-model retrains from the trace log "
                   "(default: $TAILGUARD_RETRAIN_S or 600; 0: never).")
@click.option("--reselect-interval", "reselect_interval_s", type=click.FloatRange(min=0),
              help="Seconds between memory-forecaster backtests that pick the live model "
                   "(default: $TAILGUARD_FORECAST_RESELECT_S or 1800; 0: never).")
@click.option("--keys", "keys_file", type=click.Path(dir_okay=False),
              help="API keys file: key -> tier (realtime|batch) and VIP flag.")
@click.option("--policies", "policy_file", type=click.Path(dir_okay=False),
              help="YAML overriding degradation-policy thresholds (SPEC §3 defaults).")
@click.option("--path-profile", type=click.Choice(["hot", "cold"]),
              help="Seed 001's hot path (batches of 4, 500 ms wait bound) or cold path "
                   "(batches of 16, 64 waiting at most); docs/deployment.md.")
@click.option("--enable-fault-injection", is_flag=True,
              help="Allow PUT /admin/faults to make the engine slow, stall or fail (drills).")
@click.option("--max-body-bytes", type=click.IntRange(min=1024),
              help="Largest request body (default: $TAILGUARD_MAX_BODY_BYTES or 4 MiB); "
                   "the prompt limit is the model's context (`-- --max-model-len N`).")
@click.option("--otlp-endpoint", help="Also send traces and metrics to this OpenTelemetry "
              "collector (default: $OTEL_EXPORTER_OTLP_ENDPOINT; off).")
@click.option("--otlp-protocol", type=click.Choice(["http/protobuf", "grpc"]),
              help="OTLP transport (default: $OTEL_EXPORTER_OTLP_PROTOCOL or http/protobuf).")
@click.option("--archive-dir", type=click.Path(file_okay=False),
              help="Rotate old trace rows into hive-partitioned Parquet here (off if unset).")
@click.option("--archive-after", help="Keep this much in the DB before archiving, e.g. 30d "
              "(default: the longest SLO window, so error budgets stay whole).")
@click.option("--archive-interval", "archive_interval_s", type=click.FloatRange(min=1), default=3600,
              show_default=True, help="Seconds between archive rotations.")
@click.option("--instance", help="This server's name in the archive (default: host_port).")
@click.option("--profile-server", help="Continuous profiling to this Pyroscope server "
              "(default: $TAILGUARD_PROFILE_SERVER; off).")
@click.option("--forwarded-allow-ips", help="Comma-separated proxy addresses (or *) whose "
              "X-Forwarded-For names the client (default: $TAILGUARD_FORWARDED_ALLOW_IPS; "
              "none: the client is the TCP peer).")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def serve(**options):
    """OpenAI-compatible server with full observation.

    Arguments after `--` go to vLLM's engine unchanged.

    Example: tailguard serve --port 8000 --db trace.duckdb -- --max-num-seqs 32
    """
    from serving.config import ServerConfig

    if not options["model"]:
        options.update(model=str(_embedded_model()),
                       served_model_name=options["served_model_name"] or EMBEDDED_NAME)
    try:
        config = ServerConfig(**{**options, "vllm_args": list(options["vllm_args"])})
    except ValueError as exc:
        raise click.UsageError(str(exc))
    from serving.admin.auth import AdminTokenError
    from serving.server import run

    try:
        run(config)
    except AdminTokenError as exc:  # refused before anything starts: no open admin API
        raise click.UsageError(str(exc))


def _embedded_model():
    from serving.engine.embedded_model import ensure_model

    return ensure_model()


@click.command()
@click.option("--db", type=click.Path(dir_okay=False), help="Trace-log file (read-only).")
@click.option("--url", help="A running server (its /admin/query).")
@click.option("--archive", type=click.Path(file_okay=False),
              help="Parquet archive directory (tailguard archive / serve --archive-dir): "
                   "every instance's rows, with `date` and `instance` columns.")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Admin token file for --url (default: $TAILGUARD_ADMIN_TOKEN).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True)
@click.option("--max-rows", default=10_000, show_default=True, type=click.IntRange(1))
@click.argument("sql")
def query(db, url, archive, token_file, fmt, max_rows, sql):
    """Read-only SQL over the trace log.

    Example: tailguard query --db tailguard.duckdb "SELECT status, count(*) FROM requests GROUP BY 1"

    Example: tailguard query --archive archive/ "SELECT instance, count(*) FROM requests GROUP BY 1"
    """
    from observe.query import QueryError, format_result

    source = TraceSource.pick(token_file, db=db, url=url, archive=archive)
    try:
        source.check_exists()
        result = source.query(sql, max_rows=max_rows)
    except QueryError as exc:
        raise click.UsageError(one_line(exc))
    sys.stdout.write(format_result(result, fmt))
    if result.truncated_by == "max_bytes":
        click.echo(f"(truncated to {len(result.rows)} rows: the server's answer size limit)",
                   err=True)
    elif result.truncated:
        click.echo(f"(truncated to {max_rows} rows)", err=True)


@click.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False),
              help="Trace-log file no server holds (a server archives its own log).")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Archive directory, shared by every instance (created if missing).")
@click.option("--instance", help="This file's partition name (default: HOST_FILESTEM).")
@click.option("--older-than", default="24h", show_default=True,
              help="Move rows older than this: 90m, 24h, 7d, 2w; 0 moves every row.")
def archive(db, out, instance, older_than):
    """Move old trace-log rows into hive-partitioned Parquet by date and instance,
    which `tailguard query --archive DIR` and other engines read as one dataset.

    Example: tailguard archive --db trace.duckdb --out archive/ --older-than 7d
    """
    from observe.archive import ArchiveError, archive_file, instance_name
    from slo.durations import parse_duration

    try:
        age_s = 0 if older_than.strip() == "0" else parse_duration(older_than)
        name = None if instance is None else instance_name(instance)
        before = datetime.fromtimestamp(time.time() - age_s, timezone.utc)
        name, counts = archive_file(db, out, name, before)
    except (ArchiveError, ValueError) as exc:
        raise click.UsageError(one_line(exc))
    moved = ", ".join(f"{table} {rows}" for table, rows in counts.items())
    click.echo(f"archived {sum(counts.values())} rows as instance {name} to {out} ({moved})")
