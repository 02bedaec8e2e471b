"""`tailguard dashboards`: write the Grafana dashboards generated from the metric
registry and an SLO spec."""

from __future__ import annotations

import click

from tailguard.clitools import one_line


@click.command("dashboards")
@click.option("--slo", "slo_file", type=click.Path(dir_okay=False),
              help="SLO spec YAML (default: the one shipped with tailguard).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory to write the dashboard JSON files into (created if missing).")
def dashboards(slo_file, out_dir):
    """Grafana dashboard JSON: SLO overview, latency by context bucket, engine, policies.

    Example: tailguard dashboards --out dashboards/grafana
    """
    from slo.loading import load_spec
    from slo.spec import SpecError

    try:
        spec = load_spec(slo_file)
    except SpecError as exc:
        raise click.UsageError(one_line(exc))
    from dashboards.grafana import write_all

    try:
        paths = write_all(spec, out_dir)
    except OSError as exc:
        raise click.UsageError(f"cannot write to {out_dir}: {exc.strerror or exc}")
    for path in paths:
        click.echo(str(path))
