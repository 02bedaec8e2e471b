"""`tailguard up`: the server and the console as child processes, stopped together.

Children, not threads: the server owns the engine and the trace log, the console is a
Streamlit process; either can be restarted alone, and Ctrl-C stops both cleanly.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from observe import settings as S
from serving.admin.auth import default_token_file

CONSOLE_APP = Path(__file__).resolve().parent.parent / "dashboards" / "console" / "app.py"
READY_TIMEOUT_S = 600


class LaunchError(Exception):
    """A child failed to start; the message says which and where its log is."""


@dataclass(slots=True)
class Launcher:
    host: str = "127.0.0.1"
    port: int = 8000
    console_port: int = 8501
    db: str = "tailguard.duckdb"
    serve_args: list[str] = field(default_factory=list)
    console_auth: str = "auto"  # dashboards.console.auth: login off loopback, or always
    children: list[subprocess.Popen] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def token_source(self) -> str:
        return f"${S.TAILGUARD_ADMIN_TOKEN}" if S.get(S.TAILGUARD_ADMIN_TOKEN) else str(
            default_token_file(self.db))

    def start_server(self) -> Path:
        refuse_taken_port(self.host, self.port)
        log = Path(self.db).with_suffix(".server.log")
        cmd = [sys.executable, "-m", "tailguard", "serve", "--host", self.host,
               "--port", str(self.port), "--db", self.db, *self.serve_args]
        process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.children.append(process)
        wait_ready(self.url, process, log)
        return log

    def console_env(self) -> dict[str, str]:
        """The console's environment: this server, its token, where it listens, and
        when it asks for the console password."""
        env = S.child_environ({S.TAILGUARD_URL: self.url, S.TAILGUARD_CONSOLE_HOST: self.host,
                               S.TAILGUARD_CONSOLE_AUTH: self.console_auth})
        if not S.get(S.TAILGUARD_ADMIN_TOKEN):
            env[S.TAILGUARD_ADMIN_TOKEN_FILE] = str(default_token_file(self.db))
        return env

    def start_console(self) -> None:
        self.children.append(subprocess.Popen(console_command(self.console_port, self.host),
                                              env=self.console_env(), stdout=subprocess.DEVNULL))

    def wait(self) -> int:
        """Until a child dies or we are told to stop; then stop everything."""
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(0.5):
            if any(child.poll() is not None for child in self.children):
                break
        return self.stop()

    def stop(self) -> int:
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        codes = []
        for child in self.children:
            try:
                codes.append(child.wait(timeout=60))
            except subprocess.TimeoutExpired:
                child.kill()
                codes.append(child.wait())
        return 0 if all(c in (0, -signal.SIGTERM) for c in codes) else 1


def refuse_taken_port(host: str, port: int) -> None:
    """LaunchError when something already accepts connections on `port`: the new server
    would fail to bind it only after its imports, a second or more, and meanwhile
    `wait_ready` would take the other server's /readyz for its own (a bench once drove
    its load and policy switches into another bench's server this way)."""
    near = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((near, port), timeout=1):
            pass
    except OSError:
        return
    raise LaunchError(f"{host}:{port} is already in use: another process listens there")


def wait_ready(url: str, process: subprocess.Popen, log: Path,
               timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll `url`/readyz until 200; LaunchError if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchError(f"the server exited ({process.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise LaunchError(f"the server was not ready in {timeout_s:g}s; see {log}")


def console_command(port: int, host: str = "127.0.0.1") -> list[str]:
    """Streamlit on `host`:`port`. XSRF protection and CORS checks stay on (Streamlit's
    defaults, pinned here so no config file turns them off): a page on another origin
    cannot post to a console an operator is signed in to."""
    return [sys.executable, "-m", "streamlit", "run", str(CONSOLE_APP),
            "--server.port", str(port), "--server.address", host,
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.enableXsrfProtection", "true", "--server.enableCORS", "true",
            "--client.toolbarMode", "minimal"]
