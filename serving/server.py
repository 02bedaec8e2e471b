"""Running the app under uvicorn, with a clean stop on Ctrl-C / SIGTERM."""

from __future__ import annotations

import logging

from serving.config import ServerConfig


def run(config: ServerConfig) -> None:
    import uvicorn

    from serving.app import create_app
    from serving.runtime import Runtime

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    runtime = Runtime(config)
    print(f"tailguard: admin token in {runtime.admin_token_source}", flush=True)
    print(f"tailguard: trace log {config.db}", flush=True)
    app = create_app(runtime)
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning",
                timeout_graceful_shutdown=10, **connection_settings(config))


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
