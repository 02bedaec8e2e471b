"""`tailguard up`: server and console come up, say where everything is, and stop
together on Ctrl-C. (This starts a second engine: `up` owns its own server.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import free_port

STARTUP_S = 600


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status


def test_up_serves_the_api_and_the_console_and_stops_on_ctrl_c(tmp_path):
    port, console_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "TAILGUARD_ADMIN_TOKEN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "tailguard", "up", "--port", str(port), "--console-port",
         str(console_port), "--db", str(tmp_path / "up.duckdb")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    deadline = time.monotonic() + STARTUP_S
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line, "tailguard up exited:\n" + "".join(lines)
            lines.append(line)
            if "Ctrl-C stops both" in line:
                break
        text = "".join(lines)
        assert f"http://127.0.0.1:{port}/v1" in text and f"http://127.0.0.1:{console_port}" in text
        assert str(tmp_path / "up.duckdb.admin-token") in text
        assert "console password" not in text  # loopback: no login, as before
        assert (tmp_path / "up.duckdb.admin-token").stat().st_mode & 0o777 == 0o600
        assert _get(f"http://127.0.0.1:{port}/readyz") == 200
        _wait_for(lambda: _get(f"http://127.0.0.1:{console_port}/") == 200)
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=120)
    assert code == 0
    assert (tmp_path / "up.duckdb").exists()


def test_up_refuses_an_empty_token_before_starting_anything(tmp_path):
    """Off loopback the console's password comes from the token: an empty one is
    refused at once (one line, exit 2), not after the server has tried to start."""
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=" ")
    out = subprocess.run(
        [sys.executable, "-m", "tailguard", "up", "--host", "0.0.0.0", "--port",
         str(free_port()), "--db", str(tmp_path / "up.duckdb")],
        capture_output=True, text=True, timeout=120, env=env)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("tailguard: error: admin token from $TAILGUARD_ADMIN_TOKEN is "
                          "empty; put a random token of at least 16 characters there\n")
    assert not list(tmp_path.iterdir())  # no server log, no trace file


@pytest.mark.parametrize("host, auth", [("0.0.0.0", "auto"), ("127.0.0.1", "always"),
                                        ("127.0.0.1", "auto")])
def test_up_tells_the_console_where_it_listens_and_when_to_ask(tmp_path, monkeypatch,
                                                              host, auth):
    from tailguard.launcher import Launcher

    monkeypatch.delenv("TAILGUARD_ADMIN_TOKEN", raising=False)
    db = str(tmp_path / "up.duckdb")
    env = Launcher(host, 8000, 8501, db, console_auth=auth).console_env()
    assert env["TAILGUARD_CONSOLE_HOST"] == host and env["TAILGUARD_CONSOLE_AUTH"] == auth
    assert env["TAILGUARD_ADMIN_TOKEN_FILE"] == db + ".admin-token"
    assert env["TAILGUARD_URL"] == f"http://{host}:8000"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_already_listened_on_is_refused_before_anything_starts(tmp_path, host):
    """Else the new server fails to bind only after its imports, and meanwhile the
    readiness poll takes the other process's answer for its own."""
    from tailguard.launcher import Launcher, LaunchError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        launcher = Launcher(host, port, free_port(), str(tmp_path / "up.duckdb"))
        with pytest.raises(LaunchError, match=f"^{host}:{port} is already in use"):
            launcher.start_server()
    assert launcher.children == [] and not list(tmp_path.iterdir())


def _wait_for(check, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "not up in time"
        time.sleep(0.5)
