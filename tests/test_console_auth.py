"""Console access: the password derived from the admin token, the loopback rule, the
settings the console reads, the CLI's refusal to expose a console without a token, and
the flags the launcher gives Streamlit. No server: see test_console.py for the gate
in front of the real pages."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboards.console import client
from dashboards.console.auth import ALWAYS, AUTO, Access, console_password, is_loopback
from observe import settings
from tailguard.launcher import console_command
from tests.conftest import ADMIN_TOKEN, free_port

APP = str(Path(__file__).resolve().parent.parent / "dashboards" / "console" / "app.py")
TOKEN = "a" * 32


# --- the password ----------------------------------------------------------------------

def test_the_password_is_pinned_for_a_known_token():
    assert console_password(ADMIN_TOKEN) == "klheo4dzyehe4ykvuqex5n6j"
    assert console_password(TOKEN) == "h7thkfuh4t43g36zl3xptv6x"


def test_the_password_is_an_hmac_of_the_label_keyed_by_the_token():
    digest = hmac.new(TOKEN.encode(), b"tailguard console password v1", hashlib.sha256)
    expected = base64.b32encode(digest.digest()[:15]).decode().lower()
    assert console_password(TOKEN) == expected and len(expected) == 24
    assert TOKEN not in expected and console_password(TOKEN + "b") != expected


def test_there_is_no_password_without_a_token():
    with pytest.raises(ValueError, match="token"):
        console_password("")


@pytest.mark.parametrize("typed, ok", [
    ("h7thkfuh4t43g36zl3xptv6x", True),
    ("  H7THKFUH4T43G36ZL3XPTV6X\n", True),  # pasted with spaces, typed in capitals
    ("h7thkfuh4t43g36zl3xptv6", False),  # one short
    (TOKEN, False),  # the admin token itself is not the console password
    ("", False),
    ("h7thkfuh4t43g36zl3xptv6é", False),  # not ASCII: refused, no TypeError
])
def test_check(typed, ok):
    assert Access("0.0.0.0", AUTO, TOKEN).check(typed) is ok


def test_nothing_checks_without_a_token():
    rule = Access("0.0.0.0", AUTO, "")
    assert not rule.check("") and not rule.signed_in("")


def test_a_session_mark_is_neither_the_password_nor_valid_for_another_token():
    rule = Access("0.0.0.0", AUTO, TOKEN)
    mark = rule.session_mark()
    assert rule.signed_in(mark)
    assert mark != console_password(TOKEN) and TOKEN not in mark
    assert not Access("0.0.0.0", AUTO, TOKEN + "b").signed_in(mark)  # a new token signs out
    for bad in (None, True, "", console_password(TOKEN)):
        assert not rule.signed_in(bad)


# --- the loopback rule -----------------------------------------------------------------

@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("LOCALHOST", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.1.2.3", False),
    ("192.168.0.7", False), ("console.example.com", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host, mode, required", [
    ("127.0.0.1", AUTO, False), ("127.0.0.1", ALWAYS, True),
    ("0.0.0.0", AUTO, True), ("0.0.0.0", ALWAYS, True),
    ("", AUTO, True),  # Streamlit's default address listens everywhere
])
def test_login_is_required_off_loopback_or_always(host, mode, required):
    assert Access(host, mode).login_required is required


def test_an_unknown_mode_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="mode: 'never' is not one of auto, always"):
        Access("0.0.0.0", "never")


# --- what the console reads ------------------------------------------------------------

@pytest.fixture
def env(monkeypatch):
    for name in (settings.TAILGUARD_CONSOLE_HOST, settings.TAILGUARD_CONSOLE_AUTH,
                 settings.TAILGUARD_ADMIN_TOKEN_FILE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(settings.TAILGUARD_ADMIN_TOKEN, TOKEN)
    return monkeypatch


def test_streamlit_s_address_wins_over_the_environment(env):
    env.setenv(settings.TAILGUARD_CONSOLE_HOST, "127.0.0.1")
    assert client.access("0.0.0.0") == Access("0.0.0.0", AUTO, TOKEN)
    assert client.access(None) == Access("127.0.0.1", AUTO, "")  # token not needed
    env.delenv(settings.TAILGUARD_CONSOLE_HOST)
    assert client.access(None) == Access("", AUTO, TOKEN)


def test_the_token_comes_from_the_environment_then_the_file(env, tmp_path):
    path = tmp_path / "token"
    path.write_text("b" * 20 + "\n")
    env.setenv(settings.TAILGUARD_ADMIN_TOKEN_FILE, str(path))
    assert client.access("0.0.0.0").token == TOKEN
    env.delenv(settings.TAILGUARD_ADMIN_TOKEN)
    assert client.access("0.0.0.0").token == "b" * 20
    env.setenv(settings.TAILGUARD_ADMIN_TOKEN_FILE, str(tmp_path / "missing"))
    with pytest.raises(client.ConsoleError, match="cannot read the admin token file"):
        client.access("0.0.0.0")
    assert not client.access("127.0.0.1").login_required  # loopback: the file is not read


def test_a_bad_auth_setting_is_a_console_error(env):
    env.setenv(settings.TAILGUARD_CONSOLE_AUTH, "never")
    with pytest.raises(client.ConsoleError, match=r"\$TAILGUARD_CONSOLE_AUTH: mode"):
        client.access("127.0.0.1")


def test_an_exposed_console_with_no_token_shows_only_why(env):
    env.delenv(settings.TAILGUARD_ADMIN_TOKEN)
    env.setenv(settings.TAILGUARD_CONSOLE_HOST, "0.0.0.0")
    env.setenv(settings.TAILGUARD_URL, f"http://127.0.0.1:{free_port()}")
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    assert not app.exception, app.exception
    assert [e.value for e in app.error] == [
        "This console is reachable beyond this machine and has no admin token to check a "
        "password against: set $TAILGUARD_ADMIN_TOKEN or --token-file."]
    assert not app.text_input and not app.button and not app.sidebar.selectbox


# --- the launcher and the CLI ----------------------------------------------------------

def test_the_console_runs_with_xsrf_protection_and_cors_checks_on():
    cmd = console_command(8501, "0.0.0.0")
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert flags["--server.address"] == "0.0.0.0"
    assert flags["--server.enableXsrfProtection"] == "true"
    assert flags["--server.enableCORS"] == "true"


def tailguard(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (settings.TAILGUARD_ADMIN_TOKEN,
                                                            settings.TAILGUARD_ADMIN_TOKEN_FILE)}
    if token is not None:
        env[settings.TAILGUARD_ADMIN_TOKEN] = token
    return subprocess.run([sys.executable, "-m", "tailguard", *args], capture_output=True,
                          text=True, timeout=120, env=env)


NO_TOKEN = ("tailguard: error: the console password needs the admin token (a console off "
            "loopback or with --auth always asks for it): set $TAILGUARD_ADMIN_TOKEN or "
            "--token-file\n")


@pytest.mark.parametrize("args", [("--host", "0.0.0.0"), ("--host", "::"),
                                  ("--auth", "always"), ("--print-password",)])
def test_console_refuses_to_ask_for_a_password_it_cannot_check(args):
    out = tailguard("console", "--port", str(free_port()), *args)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", NO_TOKEN)


def test_console_refuses_an_empty_or_short_token_off_loopback(tmp_path):
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    out = tailguard("console", "--host", "0.0.0.0", "--token-file", str(empty))
    assert (out.returncode, out.stdout, out.stderr) == (2, "", NO_TOKEN)
    out = tailguard("console", "--host", "0.0.0.0", token="short-token")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("tailguard: error: admin token from $TAILGUARD_ADMIN_TOKEN has 11 "
                          "characters; at least 16 are required\n")


def test_print_password_prints_the_derived_password(tmp_path):
    assert tailguard("console", "--print-password", token=TOKEN).stdout == (
        console_password(TOKEN) + "\n")
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    out = tailguard("console", "--print-password", "--token-file", str(path))
    assert (out.returncode, out.stdout, out.stderr) == (0, console_password(TOKEN) + "\n", "")
