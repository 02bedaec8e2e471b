"""The console's only way to the data: the server's admin API (DuckDB has one
writer, the server; the console never opens its file read-write)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

ENV_URL = "TAILGUARD_URL"
ENV_TOKEN = "TAILGUARD_ADMIN_TOKEN"
ENV_TOKEN_FILE = "TAILGUARD_ADMIN_TOKEN_FILE"
DEFAULT_URL = "http://127.0.0.1:8000"


class ConsoleError(Exception):
    """Something the operator must see instead of a traceback."""


@dataclass(frozen=True, slots=True)
class AdminClient:
    url: str
    token: str
    timeout_s: float = 15.0

    @classmethod
    def from_env(cls) -> "AdminClient":
        url = os.environ.get(ENV_URL, DEFAULT_URL)
        token = os.environ.get(ENV_TOKEN, "")
        path = os.environ.get(ENV_TOKEN_FILE)
        if not token and path:
            try:
                with open(path) as f:
                    token = f.read().strip()
            except OSError as exc:
                raise ConsoleError(f"cannot read the admin token file {path}: {exc.strerror}")
        return cls(url.rstrip("/"), token)

    def _call(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            self.url + path, method="GET" if body is None else "POST",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                raise ConsoleError("the server refused the admin token (401): check "
                                   f"{ENV_TOKEN} or --token-file") from None
            raise ConsoleError(_message(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConsoleError(f"the server at {self.url} is not reachable "
                               f"({getattr(exc, 'reason', exc)})") from None

    def query(self, sql: str, max_rows: int = 10_000):
        """A pandas DataFrame of a read-only query."""
        import pandas as pd

        data = self._call("/admin/query", {"sql": sql, "max_rows": max_rows})
        return pd.DataFrame(data["rows"], columns=data["columns"])

    def slo(self) -> dict:
        return self._call("/admin/slo")

    def ready(self) -> dict:
        return self._call("/readyz")


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"the server answered {exc.code}"
