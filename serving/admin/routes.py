"""Admin API (`/admin/*`): bearer-token access and the read-only SQL endpoint.

The token and its check live in `serving.admin.auth`, the SQL route in
`serving.admin.query`.
"""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from serving.admin.auth import admin_router
from serving.admin.query import add_query_route
from serving.errors import ApiError

log = logging.getLogger("tailguard")


def create_admin_router(runtime) -> APIRouter:
    """The SQL, SLO, models and flush endpoints."""
    router = admin_router(runtime)

    add_query_route(router, runtime)

    @router.get("/slo")
    async def slo():
        """Attainment, budget and burn rates of every SLO, from the trace log."""
        return JSONResponse(await asyncio.to_thread(_slo_status, runtime))

    @router.get("/models")
    async def models():
        """The live latency predictor and memory forecaster, and how they scored."""
        return JSONResponse({"latency": runtime.predictor.describe(),
                             "memory": runtime.forecast.describe()})

    @router.post("/models/{name}/retrain")
    async def retrain(name: str):
        """Retrain the latency model / re-run the forecaster backtest now. A latency
        candidate goes live only if it beats the live model on the newest requests; the
        answer is that decision (`accepted`, `reason`, both models' scores)."""
        jobs = {"latency": lambda: runtime.predictor.retrain(trigger="admin"),
                "memory": runtime.forecast.reselect}
        if name not in jobs:
            return ApiError(404, "not_found", f"no model {name!r}; one of: latency, memory"
                            ).response()
        return JSONResponse(await asyncio.to_thread(jobs[name]))

    @router.post("/archive")
    async def archive(request: Request):
        """Rotate into the Parquet archive now (`{"older_than_s": N}`, default: the
        retention), e.g. before maintenance; 409 without --archive-dir."""
        if runtime.rotator is None:
            return ApiError(409, "archive_off", "the server runs without --archive-dir"
                            ).response()
        try:
            body = await request.json() if await request.body() else {}
            older = body.get("older_than_s") if isinstance(body, dict) else None
            if older is not None and (isinstance(older, bool) or not isinstance(
                    older, (int, float)) or older < 0):
                raise ValueError("older_than_s must be a number of seconds >= 0")
        except (ValueError, RecursionError) as exc:
            return ApiError(400, "invalid_request", str(exc)).response()
        moved = await asyncio.to_thread(runtime.rotator.rotate, runtime.tracelog, older)
        return JSONResponse({"archived": moved, "instance": runtime.rotator.config.instance})

    @router.get("/tracelog")
    async def tracelog_stats():
        """The writer's state without flushing: rows pending, written and dropped."""
        return JSONResponse(runtime.tracelog.stats())

    @router.post("/flush")
    async def flush():
        """Write buffered trace rows now, the engine steps received so far with them
        (tests and scripts that read right after)."""
        def flush_all() -> None:
            runtime.ledger.publish()
            runtime.tracelog.flush()

        await asyncio.to_thread(flush_all)
        return JSONResponse(runtime.tracelog.stats())

    return router


def _slo_status(runtime) -> dict:
    from slo.report import slo_status

    runtime.tracelog.flush()  # judge every request answered so far
    return slo_status(runtime.tracelog.query, runtime.config.spec)


def jsonable(value):
    """A JSON-ready copy: timestamps as ISO text, anything odd as its str()."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)
