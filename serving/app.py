"""The OpenAI-compatible FastAPI app: routes only; the work lives in `generation`
(over the runtime's `RequestDeps`), `admin` and `runtime`."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from serving.admin.auth import admin_router
from serving.admin.policies import create_policy_router
from serving.admin.routes import create_admin_router
from serving.compat.routes import create_compat_router
from serving.errors import ApiError
from serving.generation import Endpoint, serve_generation
from serving.runtime import Runtime


def _endpoints():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    return (Endpoint("chat", ChatCompletionRequest, "chat", "create_chat_completion"),
            Endpoint("text_completion", CompletionRequest, "completion", "create_completion"),
            Endpoint("responses", ResponsesRequest, "responses", "create_responses",
                     json_mode=True))


def _schema_router(app: FastAPI, runtime: Runtime) -> APIRouter:
    """`GET /admin/openapi.json`: the OpenAPI schema, for admins only."""
    router = admin_router(runtime)

    @router.get("/openapi.json")
    async def openapi():
        return JSONResponse(app.openapi())

    return router


def create_app(runtime: Runtime) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    # No public docs or schema (the schema is at /admin/openapi.json, behind the token),
    # and no trailing-slash redirect: its Location would echo the client's Host header.
    app = FastAPI(title="tailguard", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)
    app.state.runtime = runtime
    chat, completion, responses = _endpoints()

    def _not_ready() -> JSONResponse:
        return ApiError(503, "engine_not_ready", "the engine is not ready").response()

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await serve_generation(raw, chat, runtime.deps)

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await serve_generation(raw, completion, runtime.deps)

    @app.post("/v1/responses")
    async def create_responses(raw: Request):
        return await serve_generation(raw, responses, runtime.deps)

    @app.get("/v1/models")
    async def models():
        if not runtime.ready:
            return _not_ready()
        listing = await runtime.handle.models.show_available_models()
        return JSONResponse(listing.model_dump())

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz():
        if not runtime.ready:
            return _not_ready()
        return {"status": "ready", "warmup": [call.as_dict() for call in runtime.warmup]}

    @app.get("/metrics")
    async def metrics(request: Request):
        # Off the event loop: formatting thousands of lines holds it for milliseconds
        # (the thread still takes the GIL, but gives it back every few milliseconds).
        body, content_type = await asyncio.to_thread(
            runtime.metrics_export.exposition, request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    @app.exception_handler(ApiError)
    async def refused(_: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        """Unknown routes and methods answer in the OpenAI error shape too."""
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ApiError(exc.status_code, code, str(exc.detail), headers=exc.headers).response()

    @app.exception_handler(ClientDisconnect)
    async def gone(_: Request, exc: ClientDisconnect):
        """A client gone mid-upload on a route that reads its own body (the admin API):
        nobody is left to answer, and it is no server error worth a traceback."""
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError):
        return ApiError(400, "validation_error", str(exc)).response()

    app.include_router(create_compat_router(runtime))
    app.include_router(create_admin_router(runtime))
    app.include_router(_schema_router(app, runtime))
    app.include_router(create_policy_router(runtime))
    return app
