"""Where the console's data comes from.

`AdminClient`: a running server's admin API (DuckDB has one writer, the server; the
console never opens its file read-write). `TraceFile`: with no server, a trace-log
file opened read-only: the same SQL and SLO status, but no live policies or models.
Both raise `ConsoleError` with a message for the operator, never a traceback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from dashboards.console.auth import AUTO, Access
from observe import settings
from observe.settings import (
    TAILGUARD_ADMIN_TOKEN,
    TAILGUARD_ADMIN_TOKEN_FILE,
    TAILGUARD_CONSOLE_AUTH,
    TAILGUARD_CONSOLE_DB,
    TAILGUARD_CONSOLE_HOST,
    TAILGUARD_CONSOLE_SLO,
    TAILGUARD_URL,
)

DEFAULT_URL = "http://127.0.0.1:8000"
TENANT_ROWS = 100_000  # (client, outcome) pairs: key names x 6, far below this


class ConsoleError(Exception):
    """Something the operator must see instead of a traceback."""


def _frame(data: dict):
    """The answer as a DataFrame; `attrs["truncated_by"]` says what cut it short
    ("max_rows" or "max_bytes"), None when it is whole: a view must say so."""
    import pandas as pd

    frame = pd.DataFrame(data["rows"], columns=data["columns"])
    frame.attrs["truncated_by"] = data.get("truncated_by")
    return frame


@dataclass(frozen=True, slots=True)
class AdminClient:
    url: str
    token: str
    timeout_s: float = 15.0
    live = True  # policies, overrides and models exist only on a running server

    @classmethod
    def from_env(cls) -> "AdminClient":
        return cls(settings.get(TAILGUARD_URL, DEFAULT_URL).rstrip("/"), read_token())

    @property
    def where(self) -> str:
        return self.url

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise ConsoleError("the server refused the admin token (401): check "
                                   f"{TAILGUARD_ADMIN_TOKEN} or --token-file") from None
            raise ConsoleError(_message(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConsoleError(f"the server at {self.url} is not reachable "
                               f"({getattr(exc, 'reason', exc)})") from None

    def query(self, sql: str, max_rows: int = 10_000):
        """A pandas DataFrame of a read-only query."""
        return _frame(self._call("POST", "/admin/query", {"sql": sql, "max_rows": max_rows}))

    def slo(self) -> dict:
        return self._call("GET", "/admin/slo")

    def tenants(self, minutes: int) -> list[dict]:
        """Per client over the last `minutes` (slo.tenants), through `/admin/query`."""
        from slo.tenants import tenant_status

        def rows(sql: str) -> tuple[list, list]:
            data = self._call("POST", "/admin/query", {"sql": sql, "max_rows": TENANT_ROWS})
            return data["columns"], data["rows"]

        return [t.as_dict() for t in tenant_status(rows, minutes * 60)]

    def policies(self) -> dict:
        return self._call("GET", "/admin/policies")

    def audit(self) -> dict:
        return self._call("GET", "/admin/audit")

    def models(self) -> dict:
        return self._call("GET", "/admin/models")

    def set_policy(self, name: str, mode: str, reason: str, ttl_s: float | None = None,
                   actor: str = "console") -> dict:
        body = {"mode": mode, "reason": reason, "actor": actor}
        if ttl_s:
            body["ttl_s"] = ttl_s
        return self._call("PUT", f"/admin/policies/{name}", body)


@dataclass(frozen=True, slots=True)
class TraceFile:
    """A trace log that no server holds, read-only."""

    path: str
    slo_path: str | None = None
    live = False

    @property
    def where(self) -> str:
        return f"{self.path} (read-only)"

    def query(self, sql: str, max_rows: int = 10_000):
        from observe.query import QueryError, query_file

        try:
            result = query_file(self.path, sql, max_rows=max_rows)
        except QueryError as exc:
            raise ConsoleError(str(exc)) from None
        return _frame({"columns": result.columns, "rows": result.rows,
                       "truncated_by": result.truncated_by})

    def slo(self) -> dict:
        from functools import partial

        from observe.query import QueryError, query_file
        from slo.loading import load_spec
        from slo.report import slo_status

        try:
            return slo_status(partial(query_file, self.path), load_spec(self.slo_path))
        except (QueryError, ValueError) as exc:
            raise ConsoleError(str(exc)) from None

    def tenants(self, minutes: int) -> list[dict]:
        """Per client over the last `minutes` (slo.tenants), from the file."""
        from observe.query import QueryError, query_file
        from slo.tenants import tenant_status

        def rows(sql: str) -> tuple[list, list]:
            result = query_file(self.path, sql, max_rows=TENANT_ROWS)
            return result.columns, result.rows

        try:
            return [t.as_dict() for t in tenant_status(rows, minutes * 60)]
        except QueryError as exc:
            raise ConsoleError(str(exc)) from None


def read_token(env: Mapping[str, str] | None = None) -> str:
    """The admin token: `$TAILGUARD_ADMIN_TOKEN`, else the file `$..._FILE` names; "" if
    neither. ConsoleError if the file cannot be read. `env`: a child's environment to
    read instead of this process's."""
    token = settings.get(TAILGUARD_ADMIN_TOKEN, "", env)
    path = settings.get(TAILGUARD_ADMIN_TOKEN_FILE, None, env)
    if not token and path:
        try:
            with open(path) as f:
                token = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise ConsoleError(f"cannot read the admin token file {path}: {reason}") from None
    return token.strip()


def access(bound_host: str | None) -> Access:
    """The access rule for a console listening on `bound_host` (Streamlit's
    server.address; `$TAILGUARD_CONSOLE_HOST` when that is unset, "" = everywhere)."""
    host = bound_host or settings.get(TAILGUARD_CONSOLE_HOST, "")
    try:
        rule = Access(host, settings.text(TAILGUARD_CONSOLE_AUTH, AUTO))
    except ValueError as exc:
        raise ConsoleError(f"${TAILGUARD_CONSOLE_AUTH}: {exc}") from None
    return Access(rule.host, rule.mode, read_token()) if rule.login_required else rule


def connect() -> AdminClient | TraceFile:
    """The source the launcher chose: a trace file if one was given, else the server."""
    trace_file = settings.text(TAILGUARD_CONSOLE_DB)
    if trace_file:
        return TraceFile(trace_file, settings.text(TAILGUARD_CONSOLE_SLO))
    return AdminClient.from_env()


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"the server answered {exc.code}"
