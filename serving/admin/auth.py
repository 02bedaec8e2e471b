"""The admin API's bearer token: where it comes from, what a usable one is, and the
check every `/admin` route runs.

The token resolves `TAILGUARD_ADMIN_TOKEN` -> `--admin-token-file` -> a token
generated on first start into a 0600 file beside the trace DB (path printed).
A token that is empty or shorter than `MIN_TOKEN_CHARS` once stripped is refused at
start: an empty one would let `Authorization: Bearer ` in, a short one falls to
guessing. The server then does not start (`AdminTokenError`, exit 2, one line).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from fastapi import APIRouter, Depends, Request

from observe import settings
from observe.settings import TAILGUARD_ADMIN_TOKEN
from serving.errors import ApiError

log = logging.getLogger("tailguard")

TOKEN_FILE_SUFFIX = ".admin-token"
MIN_TOKEN_CHARS = 16


class AdminTokenError(ValueError):
    """The configured admin token is unusable; the message names its source."""


def default_token_file(db: str) -> Path:
    base = Path(db) if db != ":memory:" else Path.cwd() / "tailguard"
    return base.with_name(base.name + TOKEN_FILE_SUFFIX)


def resolve_admin_token(db: str, token_file: str | None) -> tuple[str, str]:
    """(token, where it came from); AdminTokenError for an unusable token."""
    if settings.is_set(TAILGUARD_ADMIN_TOKEN):  # set, even if empty: empty is a mistake
        return usable_token(settings.get(TAILGUARD_ADMIN_TOKEN), f"${TAILGUARD_ADMIN_TOKEN}")
    path = Path(token_file) if token_file else default_token_file(db)
    if path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise AdminTokenError(f"admin token file {path}: cannot read it: {exc}") from None
        found = usable_token(text, str(path))  # refused: the one line says why, alone
        _warn_if_shared(path)
        return found
    if token_file:  # named but missing: a typo must not silently mint a new token
        raise AdminTokenError(f"admin token file {path} does not exist")
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, str(path)


def usable_token(raw: str, source: str) -> tuple[str, str]:
    """The stripped token from `source`, if it is long enough to guard anything."""
    token = raw.strip()
    if not token:
        raise AdminTokenError(f"admin token from {source} is empty; put a random token of "
                              f"at least {MIN_TOKEN_CHARS} characters there")
    if len(token) < MIN_TOKEN_CHARS:
        raise AdminTokenError(f"admin token from {source} has {len(token)} characters; "
                              f"at least {MIN_TOKEN_CHARS} are required")
    return token, source


def _warn_if_shared(path: Path) -> None:
    """A token file others can read is used (a Kubernetes secret volume is 0644 by
    default), but said loudly."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("admin token file %s is readable by others (mode %04o); "
                    "chmod 600 it", path, mode)


def check_token(request: Request, token: str) -> None:
    """401 unless the request carries `Authorization: Bearer <token>`. An empty token
    never matches, whatever the caller configured (defence in depth)."""
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    matches = hmac.compare_digest(value.strip().encode(), token.encode())
    if scheme.lower() != "bearer" or not token or not matches:
        raise ApiError(401, "unauthorized", "admin API needs 'Authorization: Bearer <token>'")


def admin_router(runtime) -> APIRouter:
    """An `/admin` router whose every route needs the runtime's admin token."""

    def require_token(request: Request) -> None:
        check_token(request, runtime.admin_token)

    return APIRouter(prefix="/admin", dependencies=[Depends(require_token)])
