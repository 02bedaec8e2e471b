"""An admin token that guards nothing is refused at start: empty, blank or short, from
the file or the environment. Before, an empty token file made `Authorization: Bearer `
open the admin API (HTTP 200 on /admin/query)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from starlette.requests import Request

from serving.admin.auth import (
    MIN_TOKEN_CHARS,
    AdminTokenError,
    check_token,
    resolve_admin_token,
)
from serving.errors import ApiError

BAD_TOKENS = {"empty": "", "blank": "  \n\t \n", "short": "x" * (MIN_TOKEN_CHARS - 1),
              "short once stripped": "  " + "y" * (MIN_TOKEN_CHARS - 1) + "  \n"}


def _serve(tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess:
    db = tmp_path / "trace.duckdb"
    return subprocess.run([sys.executable, "-m", "tailguard", "serve", "--db", str(db),
                           "--port", "1", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("name", list(BAD_TOKENS))
def test_serve_refuses_an_unusable_token_file(tmp_path, name):
    token_file = tmp_path / "admin-token"
    token_file.write_text(BAD_TOKENS[name])
    env = {k: v for k, v in os.environ.items() if k != "TAILGUARD_ADMIN_TOKEN"}
    done = _serve(tmp_path, env, "--admin-token-file", str(token_file))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(token_file) in lines[0], done.stderr
    assert not (tmp_path / "trace.duckdb").exists()  # refused before opening anything


@pytest.mark.parametrize("name", ["empty", "blank", "short"])
def test_serve_refuses_an_unusable_token_variable(tmp_path, name):
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=BAD_TOKENS[name])
    done = _serve(tmp_path, env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "$TAILGUARD_ADMIN_TOKEN" in lines[0], done.stderr


def test_a_missing_named_token_file_is_refused_not_minted(tmp_path, monkeypatch):
    monkeypatch.delenv("TAILGUARD_ADMIN_TOKEN", raising=False)
    with pytest.raises(AdminTokenError, match="does not exist"):
        resolve_admin_token(str(tmp_path / "t.duckdb"), str(tmp_path / "typo"))
    assert not (tmp_path / "typo").exists()


def test_a_token_of_the_minimum_length_is_used_stripped(tmp_path, monkeypatch):
    monkeypatch.delenv("TAILGUARD_ADMIN_TOKEN", raising=False)
    token_file = tmp_path / "admin-token"
    token_file.write_text(" " + "z" * MIN_TOKEN_CHARS + "\n")
    token_file.chmod(0o600)
    assert resolve_admin_token("x.duckdb", str(token_file)) == ("z" * MIN_TOKEN_CHARS,
                                                                 str(token_file))
    monkeypatch.setenv("TAILGUARD_ADMIN_TOKEN", "e" * 40)
    assert resolve_admin_token("x.duckdb", str(token_file)) == ("e" * 40,
                                                                "$TAILGUARD_ADMIN_TOKEN")


def _request(authorization: str | None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "GET", "path": "/admin/x", "headers": headers})


@pytest.mark.parametrize("given", [None, "", "Bearer", "Bearer ", "Bearer  ", "Basic x",
                                   "bearer wrong-token-wrong-token"])
def test_an_empty_configured_token_never_matches(given):
    """Defence in depth: even if an empty token reached the check, nothing passes."""
    for token in ("", "right-token-right-token"):
        with pytest.raises(ApiError) as refused:
            check_token(_request(given), token)
        assert refused.value.status == 401


def test_the_right_token_passes_in_any_scheme_case():
    token = "right-token-right-token"
    for given in (f"Bearer {token}", f"bearer {token}", f"BEARER {token} "):
        check_token(_request(given), token)
