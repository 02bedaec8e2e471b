"""Talking to a running tailguard server's admin API from the CLI."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from observe import settings
from observe.query import QueryError, QueryResult
from observe.settings import TAILGUARD_ADMIN_TOKEN


def admin_token(token_file: str | None) -> str:
    if token_file:
        try:
            with open(token_file) as f:
                return f.read().strip()
        except OSError as exc:
            raise QueryError(f"cannot read token file {token_file}: {exc.strerror}")
    token = settings.get(TAILGUARD_ADMIN_TOKEN)
    if not token:
        raise QueryError(f"--url needs the admin token: set {TAILGUARD_ADMIN_TOKEN} "
                         "or --token-file")
    return token


def post_admin(url: str, path: str, body: dict | None, token: str,
               timeout: float = 30.0) -> dict:
    """POST `body` (GET when None) to an admin endpoint; QueryError on any failure."""
    request = urllib.request.Request(
        url.rstrip("/") + path, data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise QueryError(_error_message(exc))
    except (urllib.error.URLError, OSError) as exc:
        raise QueryError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}")


def _error_message(exc) -> str:
    try:
        return f"server said {exc.code}: {json.loads(exc.read())['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"server said {exc.code}"


def query_url(url: str, sql: str, token_file: str | None, max_rows: int) -> QueryResult:
    data = post_admin(url, "/admin/query", {"sql": sql, "max_rows": max_rows},
                      admin_token(token_file))
    return QueryResult(data["columns"], [tuple(r) for r in data["rows"]], data["truncated"],
                       truncated_by=data.get("truncated_by"))
