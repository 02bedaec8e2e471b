"""`tailguard slo status`: SLO attainment, error budget and burn rates."""

from __future__ import annotations

import json
import sys

import click


@click.group("slo")
def slo():
    """Service level objectives."""


@slo.command("status")
@click.option("--db", type=click.Path(dir_okay=False), help="Trace-log file (read-only).")
@click.option("--url", help="A running server (its /admin/slo).")
@click.option("--token-file", type=click.Path(dir_okay=False),
              help="Admin token file for --url (default: $TAILGUARD_ADMIN_TOKEN).")
@click.option("--slo", "slo_file", type=click.Path(dir_okay=False),
              help="SLO spec for --db (default: the shipped one; --url uses the server's).")
@click.option("--groups", is_flag=True, help="Also per context bucket and priority.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def status(db, url, token_file, slo_file, groups, fmt):
    """Attainment, error budget left, burn rate per window and goodput.

    Example: tailguard slo status --db tailguard.duckdb --groups
    """
    from observe.query import QueryError
    from slo.report import format_status
    from slo.spec import SpecError
    from tailguard.clitools import TraceSource

    source = TraceSource.pick(token_file, db=db, url=url)
    try:
        data = source.slo_status(slo_file)
    except (QueryError, SpecError) as exc:
        raise click.UsageError(str(exc))
    out = json.dumps(data, indent=1) + "\n" if fmt == "json" else format_status(data, groups)
    sys.stdout.write(out)
