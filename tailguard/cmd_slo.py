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
@click.option("--tenants", is_flag=True,
              help="Also per client (API key name) over the last hour: requests by outcome, "
                   "attainment, goodput, shed.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def status(db, url, token_file, slo_file, groups, tenants, fmt):
    """Attainment, error budget left, burn rate per window and goodput.

    Example: tailguard slo status --db tailguard.duckdb --groups --tenants
    """
    from observe.query import QueryError
    from slo.report import format_status
    from slo.spec import SpecError
    from slo.tenants import format_tenants, tenant_status
    from tailguard.clitools import TraceSource

    source = TraceSource.pick(token_file, db=db, url=url)
    try:
        data = source.slo_status(slo_file)
    except (QueryError, SpecError) as exc:
        raise click.UsageError(str(exc))
    if tenants:  # through the same read-only query path as `tailguard query`
        data["tenants"] = [t.as_dict() for t in tenant_status(
            source.columns_and_rows(max_rows=100_000, timeout_s=60))]
    out = json.dumps(data, indent=1) + "\n" if fmt == "json" else format_status(data, groups)
    if tenants and fmt != "json":
        out += format_tenants(data["tenants"])
    sys.stdout.write(out)
