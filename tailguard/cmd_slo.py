"""`tailguard slo status`: SLO attainment, error budget and burn rates."""

from __future__ import annotations

import json
import os
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

    if bool(db) == bool(url):
        raise click.UsageError("give exactly one of --db FILE or --url URL")
    try:
        data = _from_file(db, slo_file) if db else _from_server(url, token_file)
    except (QueryError, SpecError) as exc:
        raise click.UsageError(str(exc))
    out = json.dumps(data, indent=1) + "\n" if fmt == "json" else format_status(data, groups)
    sys.stdout.write(out)


def _from_file(db: str, slo_file: str | None) -> dict:
    from observe.query import QueryError, query_file
    from slo.budget import compute_status
    from slo.report import status_to_dict
    from slo.loading import load_spec

    spec = load_spec(slo_file)
    if not os.path.exists(db):
        raise QueryError(f"no such trace log: {db}")

    def query(sql: str):
        result = query_file(db, sql, max_rows=100_000, timeout_s=60)
        return result.columns, result.rows

    return status_to_dict(compute_status(query, spec))


def _from_server(url: str, token_file: str | None) -> dict:
    from tailguard.remote import admin_token, post_admin

    return post_admin(url, "/admin/slo", None, admin_token(token_file))
