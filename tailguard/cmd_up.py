"""`tailguard up` (server + console) and `tailguard console`."""

from __future__ import annotations

import subprocess
import sys

import click

from observe import settings as S

AUTH_CHOICE = click.Choice(["auto", "always"])
AUTH_HELP = "Ask for the console password: off loopback only (auto) or always."


@click.command("up")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--console-port", default=8501, show_default=True, type=click.IntRange(1, 65535))
@click.option("--db", default="tailguard.duckdb", show_default=True, help="Trace-log file.")
@click.option("--demo", is_flag=True, help="Drive realistic background load.")
@click.option("--demo-rate", default=2.0, show_default=True, type=click.FloatRange(min=0.1))
@click.option("--console-auth", default="auto", show_default=True, type=AUTH_CHOICE,
              help=AUTH_HELP)
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def up(host, port, console_port, db, demo, demo_rate, console_auth, serve_args):
    """The main job: the server on the embedded model and the ops console.

    Extra arguments go to `tailguard serve`. Ctrl-C stops both. Off loopback the
    console asks for a password derived from the admin token (docs/console.md).

    Example: tailguard up --demo
    """
    from dashboards.console.auth import Access
    from serving.engine.embedded_model import ensure_model
    from tailguard.launcher import Launcher, LaunchError

    if S.is_set(S.TAILGUARD_ADMIN_TOKEN):  # the server would refuse it, but after a minute
        _usable(S.get(S.TAILGUARD_ADMIN_TOKEN), f"${S.TAILGUARD_ADMIN_TOKEN}")
    click.echo(f"tailguard: embedded model at {ensure_model()}")
    launcher = Launcher(host, port, console_port, db, list(serve_args), console_auth)
    click.echo("tailguard: starting the server (engine start and warm-up take a minute)...")
    try:
        log = launcher.start_server()
        launcher.start_console()
    except LaunchError as exc:
        launcher.stop()
        raise click.ClickException(str(exc))
    if demo:
        from loadgen.demo import start_demo

        start_demo(launcher.url, demo_rate)
    click.echo(f"tailguard: API      {launcher.url}/v1   (OpenAI-compatible; metrics at /metrics)")
    click.echo(f"tailguard: console  http://{host}:{console_port}")
    click.echo(f"tailguard: admin token in {launcher.token_source}; server log {log}")
    if Access(host, console_auth).login_required:
        click.echo(f"tailguard: console password: tailguard console --print-password"
                   f"{_token_file_arg(launcher.token_source)}")
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
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The console's own address; off loopback it asks for the console password.")
@click.option("--auth", default="auto", show_default=True, type=AUTH_CHOICE, help=AUTH_HELP)
@click.option("--print-password", is_flag=True,
              help="Print the console password (derived from the admin token) and exit.")
def console(url, token_file, db, slo, refresh, port, host, auth, print_password):
    """The Streamlit ops console for a running server (or a trace file).

    Example: tailguard console --url http://127.0.0.1:8000 --token-file tailguard.duckdb.admin-token
    """
    from dashboards.console.auth import Access, console_password
    from tailguard.launcher import console_command

    if slo and not db:
        raise click.UsageError("--slo goes with --db (a server judges by its own spec)")
    env = S.child_environ({S.TAILGUARD_URL: url, S.TAILGUARD_CONSOLE_REFRESH_S: str(refresh),
                           S.TAILGUARD_CONSOLE_HOST: host, S.TAILGUARD_CONSOLE_AUTH: auth})
    if token_file:
        env[S.TAILGUARD_ADMIN_TOKEN_FILE] = token_file
    if db:
        env.update({S.TAILGUARD_CONSOLE_DB: db, S.TAILGUARD_CONSOLE_SLO: slo or ""})
    if print_password or Access(host, auth).login_required:
        password = console_password(_login_token(env))
        if print_password:
            click.echo(password)
            return
    click.echo(f"tailguard: console on http://{host}:{port} for {db or url}")
    sys.exit(subprocess.call(console_command(port, host), env=env))


def _login_token(env: dict[str, str]) -> str:
    """The admin token the console password comes from, held to the server's rules."""
    from dashboards.console.client import ConsoleError, read_token

    try:
        token = read_token(env)
    except ConsoleError as exc:
        raise click.UsageError(str(exc)) from None
    if not token:
        raise click.UsageError(f"the console password needs the admin token (a console off "
                               f"loopback or with --auth always asks for it): set "
                               f"${S.TAILGUARD_ADMIN_TOKEN} or --token-file")
    source = (f"${S.TAILGUARD_ADMIN_TOKEN}" if env.get(S.TAILGUARD_ADMIN_TOKEN)
              else env[S.TAILGUARD_ADMIN_TOKEN_FILE])
    return _usable(token, source)


def _usable(token: str, source: str) -> str:
    from serving.admin.auth import AdminTokenError, usable_token

    try:
        return usable_token(token, source)[0]
    except AdminTokenError as exc:
        raise click.UsageError(str(exc)) from None


def _token_file_arg(token_source: str) -> str:
    return "" if token_source.startswith("$") else f" --token-file {token_source}"
