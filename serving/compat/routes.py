"""The non-generation endpoints a `vllm serve` user's tools call: `/tokenize`,
`/detokenize` (routers and clients count tokens with them), the probes `/health` and
`/ping` (Kubernetes, KServe, SageMaker), `/version` and `/load`. Each answers as
vLLM's server does, on vLLM's own serving class where one exists; the differences are
deliberate and listed in docs/compatibility.md (a key is asked for where the server
asks for one, errors take tailguard's OpenAI shape)."""

from __future__ import annotations

import functools

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from serving.errors import (
    ApiError,
    engine_not_ready,
    from_exception,
    from_vllm_response,
    key_required,
)
from serving.generation import ClientGone, parse_body, read_json
from serving.runtime import Runtime


def create_compat_router(runtime: Runtime) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(raw: Request):
        return await _tokenization(runtime, raw, _tokenize_validator(), "create_tokenize")

    @router.post("/detokenize")
    async def detokenize(raw: Request):
        from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest

        return await _tokenization(runtime, raw, DetokenizeRequest.model_validate,
                                   "create_detokenize")

    @router.get("/health")
    async def health():
        return Response(status_code=200 if await _healthy(runtime) else 503)

    @router.api_route("/ping", methods=["GET", "POST"])
    async def ping():  # SageMaker's name for the same probe
        return Response(status_code=200 if await _healthy(runtime) else 503)

    @router.get("/version")
    async def version():
        from vllm.version import __version__

        return JSONResponse({"version": __version__})

    @router.get("/load")
    async def load():
        """Generation requests in flight (vLLM counts them only with
        `--enable-server-load-tracking`; tailguard always does)."""
        return JSONResponse({"server_load": runtime.observer.in_flight})

    return router


@functools.cache
def _tokenize_validator():
    """vLLM's `TokenizeRequest` is a union (a prompt, or chat messages): a TypeAdapter's
    validator, built once."""
    from pydantic import TypeAdapter
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeRequest

    return TypeAdapter(TokenizeRequest).validate_python


async def _healthy(runtime: Runtime) -> bool:
    """The engine is up and answers vLLM's own health check: 503 while it starts, is
    restarted by breaker L2, or has died (as vLLM's 503 on `EngineDeadError`)."""
    if not runtime.ready:  # no engine yet, or one that errored
        return False
    try:
        await runtime.handle.engine.check_health()
    except Exception:
        return False
    return True


async def _tokenization(runtime: Runtime, raw: Request, validate, handler: str):
    """vLLM's `ServingTokenization` behind the same gate as generation: a valid key
    where the server asks for one, a ready engine, a bounded JSON body."""
    try:
        if runtime.deps.keys.resolve(raw.headers.get("authorization")) is None:
            raise key_required()
        if not runtime.ready:
            raise engine_not_ready()
        request = parse_body(validate, await read_json(raw, runtime.config.max_body_bytes))
        try:
            result = await getattr(runtime.handle.tokenization, handler)(request, raw)
        except Exception as exc:
            raise from_exception(exc) from None
    except ApiError as exc:
        return exc.response()
    except ClientGone:
        return Response(status_code=499)
    if hasattr(result, "error"):  # vLLM's ErrorResponse
        return from_vllm_response(result).response()
    return JSONResponse(result.model_dump())
