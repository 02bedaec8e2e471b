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
                timeout_graceful_shutdown=10)
