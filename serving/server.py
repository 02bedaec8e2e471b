"""Running the app under uvicorn, with a clean stop on Ctrl-C / SIGTERM."""

from __future__ import annotations

import logging
import sys
from typing import Final

from serving.config import ServerConfig

# The trace writer's thread shares the GIL with a busy event loop, and each time it
# gives the GIL up (every DuckDB call, every Arrow hand-back) it waits up to the switch
# interval to get it back: at Python's 5 ms a flush of one second's rows took 185 ms
# beside a saturated loop (21 ms beside an idle one), and on a slower machine the
# writer fell seconds behind. At 1 ms: 52 ms. Switches happen only when a thread waits.
GIL_SWITCH_INTERVAL_S: Final = 0.001


def run(config: ServerConfig) -> None:
    import uvicorn

    from serving.app import create_app
    from serving.runtime import Runtime

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
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
