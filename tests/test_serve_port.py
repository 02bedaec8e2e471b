"""`tailguard serve` binds its port before the engine starts, as vLLM's own server does
(vllm-project/vllm#8204): a port already taken fails at once, with uvicorn's message and
its start-up exit status (3), and no engine is started for nothing. (uvicorn.run binds
after the app's start-up: the engine's 30 s and more, during which the OS could hand
the port to a socket the engine opened; the CI saw "address already in use" then.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.conftest import ADMIN_TOKEN


def test_a_taken_port_fails_before_the_engine_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tailguard", "serve", "--db", str(tmp_path / "trace.duckdb"),
             "--port", str(port)], capture_output=True, text=True, timeout=300,
            env=dict(os.environ, TAILGUARD_ADMIN_TOKEN=ADMIN_TOKEN))
    out = done.stdout + done.stderr
    assert done.returncode == 3, out[-3000:]
    assert "address already in use" in out.lower(), out[-3000:]
    assert f"tailguard: cannot listen on 127.0.0.1:{port}" in done.stderr, out[-3000:]
    assert "EngineCore" not in out and "engine up" not in out, out[-3000:]
