"""Shared fixtures: one real tailguard server (real vLLM engine on the embedded
model, real DuckDB file) per test session, started through the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ADMIN_TOKEN = "test-admin-token"
# The session server judges by the default SLOs plus `ttft_breach` (a 1 µs TTFT target
# every request misses), so burn-rate alerts can be seen firing end to end.
SESSION_SLO = Path(__file__).parent / "data" / "slo_breach.yaml"
DEFAULT_POLICIES = Path(__file__).parent / "data" / "policies_default.yaml"
STARTUP_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    db: Path
    process: subprocess.Popen
    log: Path

    def admin(self, path: str, body: dict | None = None, token: str = ADMIN_TOKEN) -> dict:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body or {}).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def sql(self, sql: str) -> list[dict]:
        """Flush, then run a read-only query through the server."""
        self.admin("/admin/flush")
        data = self.admin("/admin/query", {"sql": sql})
        return [dict(zip(data["columns"], row)) for row in data["rows"]]

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()


def start_server(tmp: Path, *extra: str) -> Server:
    port = free_port()
    db = tmp / "trace.duckdb"
    log = tmp / "server.log"
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=ADMIN_TOKEN)
    if "--policies" not in extra:  # no deadline check unless a test asks for policies
        extra = ("--policies", str(DEFAULT_POLICIES), *extra)
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db", str(db),
           "--flush-interval", "0.2", *extra]
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", db, process, log)
    _wait_ready(server)
    return server


def _wait_ready(server: Server) -> None:
    from tailguard.launcher import LaunchError, wait_ready

    try:
        wait_ready(server.url, server.process, server.log, STARTUP_TIMEOUT_S)
    except LaunchError as exc:
        server.process.kill()
        raise RuntimeError(f"{exc}:\n{server.log.read_text()[-4000:]}") from None


def stop_process(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_server(server: Server) -> None:
    """SIGTERM (the server stops its engine), then make sure no engine process of
    this server outlives it, whatever state it was left in."""
    import psutil

    from serving.engine.processes import alive, kill_all

    try:
        engines = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        engines = []
    server.process.terminate()
    try:
        server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    kill_all([p for p in engines if alive(p)], "it outlived its test server")


@pytest.fixture(scope="session")
def session_spec():
    from slo.loading import load_spec

    return load_spec(SESSION_SLO)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    # Models retrain only when a test asks (POST /admin/models/.../retrain), so what a
    # test sees does not depend on how long the session has run.
    srv = start_server(tmp_path_factory.mktemp("server"), "--slo", str(SESSION_SLO),
                       "--retrain-interval", "0", "--reselect-interval", "0")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def model_name(server) -> str:
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
        return json.loads(resp.read())["data"][0]["id"]


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
