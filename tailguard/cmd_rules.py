"""`tailguard rules`: Prometheus rules and their promtool tests from an SLO spec."""

from __future__ import annotations

from pathlib import Path

import click

from alerts.config import DEFAULT_JOB, DEFAULT_RUNBOOK_BASE
from tailguard.clitools import one_line


@click.command("rules")
@click.option("--slo", "slo_file", type=click.Path(dir_okay=False),
              help="SLO spec YAML (default: the one shipped with tailguard).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for the rule file and its promtool tests (created if needed).")
@click.option("--job", default=DEFAULT_JOB, show_default=True,
              help="Prometheus scrape job of the tailguard servers.")
@click.option("--runbook-base", default=DEFAULT_RUNBOOK_BASE, show_default=True,
              help="Where docs/alerts.md is published; alerts link to its sections.")
def rules(slo_file, out_dir, job, runbook_base):
    """Prometheus recording + alert rules (Sloth-compatible) and promtool unit tests.

    \b
    Example: tailguard rules --slo slo.yaml --out alerts/generated
    Check:   promtool check rules DIR/tailguard-rules.yml
             promtool test rules DIR/tailguard-rules.test.yml
    """
    from alerts.config import RuleConfig
    from alerts.rules import write
    from slo.loading import load_spec
    from slo.spec import SpecError

    try:
        spec = load_spec(slo_file)
        config = RuleConfig(job=job, runbook_base=runbook_base)
    except (SpecError, ValueError) as exc:
        raise click.UsageError(one_line(exc))
    try:
        written = write(spec, Path(out_dir), config, source=slo_file)
    except OSError as exc:
        raise click.UsageError(f"--out {out_dir}: cannot write: {exc.strerror}")
    for path in written:
        click.echo(str(path))
