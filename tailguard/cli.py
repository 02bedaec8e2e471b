"""The `tailguard` command: one click group, thin commands over library code.

Bad arguments exit 2 with one line on stderr, never a traceback.
"""

from __future__ import annotations

import sys

import click

from tailguard import commands
from tailguard.cmd_bench import bench
from tailguard.cmd_dashboards import dashboards
from tailguard.cmd_nginx import nginx
from tailguard.cmd_predict import forecast, predict
from tailguard.cmd_replay import replay
from tailguard.cmd_rules import rules
from tailguard.cmd_slo import slo
from tailguard.cmd_up import console, up


class Group(click.Group):
    """Click group whose usage errors are one line and exit code 2."""

    def main(self, args=None, prog_name=None, **kwargs):
        if args is None and sys.argv[1:2] == ["serve"]:  # a real command line, not a test
            from serving.engine.allocator import reexec_with_tcmalloc

            reexec_with_tcmalloc(sys.argv[1:])
        try:
            rv = super().main(args=args, prog_name=prog_name or "tailguard",
                              standalone_mode=False, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            sys.exit(130)
        except click.ClickException as exc:
            click.echo(f"tailguard: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code if exc.exit_code != 1 else 2)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=Group)
@click.version_option(package_name="tailguard")
def main():
    """tailguard: observe, judge and protect LLM inference served by vLLM."""


main.add_command(commands.model)
main.add_command(commands.serve)
main.add_command(commands.query)
main.add_command(commands.archive)
main.add_command(dashboards)
main.add_command(rules)
main.add_command(slo)
main.add_command(bench)
main.add_command(up)
main.add_command(console)
main.add_command(predict)
main.add_command(forecast)
main.add_command(replay)
main.add_command(nginx)
