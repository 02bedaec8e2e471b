"""Running the app under uvicorn, with a clean stop on Ctrl-C / SIGTERM."""

from __future__ import annotations

import logging
import sys

from serving.config import ServerConfig


def run(config: ServerConfig) -> None:
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    from serving.app import create_app
    from serving.runtime import Runtime

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    runtime = Runtime(config)
    print(f"tailguard: admin token in {runtime.admin_token_source}", flush=True)
    print(f"tailguard: trace log {config.db}", flush=True)
    app = create_app(runtime)
    server = uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning",
        timeout_graceful_shutdown=10, **connection_settings(config)))
    # Bound now, not after the app's start-up (the engine's, 30 s and more on a CPU) as
    # uvicorn.run would, the order vLLM's own server keeps (vllm-project/vllm#8204): a
    # port already taken fails at once, and no socket the engine opens meanwhile can be
    # handed our port by the OS (the CI saw it: "address already in use" after start-up).
    try:
        sock = server.config.bind_socket()  # exits 3 after uvicorn's message when taken
    except SystemExit:
        print(f"tailguard: cannot listen on {config.host}:{config.port}", file=sys.stderr)
        raise
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # as uvicorn.run: the start-up failed


def connection_settings(config: ServerConfig) -> dict:
    """uvicorn's settings for connections: our protocol with its deadlines and cap, and
    X-Forwarded-For believed only from the proxies named (uvicorn's default believes
    any loopback client, which would let a local caller forge the audit's actor)."""
    from serving.http_limits import protocol_class

    limits = config.http_limits
    proxied = bool(config.forwarded_allow_ips)
    return {"http": protocol_class(limits), "timeout_keep_alive": limits.keep_alive_s,
            "proxy_headers": proxied,
            "forwarded_allow_ips": config.forwarded_allow_ips if proxied else None}
