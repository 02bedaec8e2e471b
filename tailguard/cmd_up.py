"""`tailguard up` (server + console) and `tailguard console`."""

from __future__ import annotations

import os
import subprocess
import sys

import click


@click.command("up")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--console-port", default=8501, show_default=True, type=click.IntRange(1, 65535))
@click.option("--db", default="tailguard.duckdb", show_default=True, help="Trace-log file.")
@click.option("--demo", is_flag=True, help="Drive realistic background load.")
@click.option("--demo-rate", default=2.0, show_default=True, type=click.FloatRange(min=0.1))
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def up(host, port, console_port, db, demo, demo_rate, serve_args):
    """The main job: the server on the embedded model and the ops console.

    Extra arguments go to `tailguard serve`. Ctrl-C stops both.

    Example: tailguard up --demo
    """
    from serving.launcher import Launcher, LaunchError
    from serving.model import ensure_model

    click.echo(f"tailguard: embedded model at {ensure_model()}")
    launcher = Launcher(host, port, console_port, db, list(serve_args))
    click.echo("tailguard: starting the server (engine start and warm-up take a minute)...")
    try:
        log = launcher.start_server()
        launcher.start_console()
    except LaunchError as exc:
        launcher.stop()
        raise click.ClickException(str(exc))
    if demo:
        from serving.demo import start_demo

        start_demo(launcher.url, demo_rate)
    click.echo(f"tailguard: API      {launcher.url}/v1   (OpenAI-compatible; metrics at /metrics)")
    click.echo(f"tailguard: console  http://{host}:{console_port}")
    click.echo(f"tailguard: admin token in {launcher.token_source}; server log {log}")
    click.echo("tailguard: Ctrl-C stops both" + (" (demo load running)" if demo else ""))
    sys.exit(launcher.wait())


@click.command("console")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True,
              help="The server whose admin API the console reads and writes.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
              help="Admin token file (default: $TAILGUARD_ADMIN_TOKEN).")
@click.option("--db", type=click.Path(exists=True, dir_okay=False),
              help="No server: read this trace file read-only instead of --url.")
@click.option("--slo", type=click.Path(exists=True, dir_okay=False),
              help="With --db: the SLO spec to judge the file by (default: built-in).")
@click.option("--refresh", default=5, show_default=True, type=click.IntRange(0, 300),
              help="Auto-refresh interval in seconds (0 = off).")
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535))
def console(url, token_file, db, slo, refresh, port):
    """The Streamlit ops console for a running server (or a trace file).

    Example: tailguard console --url http://127.0.0.1:8000 --token-file tailguard.duckdb.admin-token
    """
    from dashboards.console.client import (
        ENV_DB,
        ENV_REFRESH,
        ENV_SLO,
        ENV_TOKEN_FILE,
        ENV_URL,
    )
    from serving.launcher import console_command

    if slo and not db:
        raise click.UsageError("--slo goes with --db (a server judges by its own spec)")
    env = dict(os.environ, **{ENV_URL: url, ENV_REFRESH: str(refresh)})
    if token_file:
        env[ENV_TOKEN_FILE] = token_file
    if db:
        env.update({ENV_DB: db, ENV_SLO: slo or ""})
    click.echo(f"tailguard: console on http://127.0.0.1:{port} for {db or url}")
    sys.exit(subprocess.call(console_command(port), env=env))
