"""The generation endpoints: parse and check the body, run vLLM's serving handler
on the observed engine, and make sure the request's record is finished exactly
once, whatever happens (success, rejection, engine failure, client gone).

The whole path reads in `_generate`, over the typed `RequestDeps` the runtime builds."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from observe import registry as R
from serving.engine.observed import current_request
from serving.errors import (
    ApiError,
    engine_not_ready,
    from_exception,
    from_outcome,
    from_refusal,
    from_validation,
    from_vllm_response,
    key_required,
)
from serving.http_limits import body_timed_out
from serving.keys import PRIORITY_HEADER, Client
from serving.runtime import RequestDeps
from serving.streaming import (
    CLIENT_CLOSED,
    TimedStreamingResponse,
    observed_stream,
    Started,
    settle,
)

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client disconnected before the response was complete."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str  # the trace log's `endpoint` (its gen_ai.operation.name: R.OPERATIONS)
    request_cls: type
    serving: str  # attribute of `EngineHandle` holding vLLM's serving object
    handler: str  # its method to call
    json_mode: bool = False  # dump the answer as vLLM's router does for it (by alias)


async def serve_generation(raw: Request, endpoint: Endpoint, deps: RequestDeps):
    """One generation request: a record begun, the request path run, an answer; the
    record is finished exactly once on every path (a stream's when the stream ends)."""
    rec, span = deps.observer.begin(endpoint.name, raw.headers)
    _pin_request_id(raw, rec.request_id)
    current_request.set(rec)
    handle = deps.engine.handle if deps.engine.ready else None
    engine = handle and handle.engine
    try:
        result = await _generate(raw, endpoint, deps, rec, handle)
    except ApiError as exc:
        rec.fail(exc.status, exc.error_type, exc.message, exc.outcome)
        await settle(engine, rec)  # a refused prompt of several: the others end too
        deps.observer.finish(rec, span)
        return _with_id(exc.response(), rec)
    except ClientGone:
        rec.fail(CLIENT_CLOSED, "client_disconnected", "client went away", R.STATUS_ABORTED)
        await settle(engine, rec)
        deps.observer.finish(rec, span)
        return None
    except Exception as exc:  # a bug of ours: still a row, still a JSON answer
        log.exception("request %s failed", rec.request_id)
        error = ApiError(500, "internal_error", f"internal error: {type(exc).__name__}")
        rec.fail(error.status, error.error_type, str(exc), error.outcome)
        with contextlib.suppress(Exception):  # the row matters more than the clean-up
            await settle(engine, rec)  # the engine wrapper forgets the request
        deps.observer.finish(rec, span)
        return _with_id(error.response(), rec)
    if isinstance(result, Started):
        stream = observed_stream(result, rec, span, deps.observer, engine)
        return _with_id(TimedStreamingResponse(
            stream, deps.config.stream_write_timeout_s, rec,
            media_type="text/event-stream"), rec)
    deps.observer.finish(rec, span)
    body = result.model_dump(mode="json", by_alias=True) if endpoint.json_mode \
        else result.model_dump()
    return _with_id(JSONResponse(body), rec)


async def _generate(raw: Request, endpoint: Endpoint, deps: RequestDeps, rec, handle):
    """The request path, in order: who calls (first, so that every refusal's row names
    its client), engine ready, a valid key, body, limits, the client's quota, admission,
    then vLLM's handler. Any stage may refuse (an `ApiError`)."""
    client = _identify(deps.keys, rec, raw)
    if handle is None:
        raise engine_not_ready()
    if client is None:
        raise key_required()
    request = parse_body(endpoint.request_cls.model_validate,
                         await read_json(raw, deps.config.max_body_bytes))
    rec.model, rec.stream = request.model or deps.config.model_name, bool(request.stream)
    _check_limits(request, deps.config.max_n)
    deps.quota.take(rec, _quota_key(deps.keys, client, raw), request)
    refusal = deps.admission.check_http(rec, request)
    if refusal is not None:
        raise from_refusal(refusal)
    serving = getattr(handle, endpoint.serving)
    return await _until_disconnect(raw, _start(serving, endpoint.handler, request, raw,
                                               handle.engine, rec.request_id))


def _identify(keys, rec, raw: Request) -> Client | None:
    """The caller, from the API key (never from a header alone): its name, priority and
    VIP flag on the record; None when no valid key came (a 401)."""
    client = keys.resolve(raw.headers.get("authorization"), raw.headers.get(PRIORITY_HEADER))
    if client is not None:
        rec.priority, rec.vip, rec.client = client.tier, client.vip, client.name
    return client


def _quota_key(keys, client: Client, raw: Request) -> str:
    """Who the client is for its quota: the key's name, else its peer address (the quota's
    only; the trace log and metrics name a keyless caller `anonymous`)."""
    peer = raw.client.host if raw.client else None
    return f"key:{client.name}" if keys.requires_key else f"peer:{peer or '?'}"


def _with_id(response, rec):
    """Every answer names its trace-log row (`X-Request-Id`), refusals too."""
    response.headers["X-Request-Id"] = rec.request_id
    if rec.policy_actions:
        response.headers["X-Tailguard-Policy-Actions"] = ",".join(rec.policy_actions)
    return response


async def _start(serving, handler: str, request, raw: Request, engine, owner: str):
    """Call vLLM's handler; for a stream, wait for its first chunk before answering,
    so that admission (which runs when the engine is first asked) can still refuse
    with a real status code instead of an error event inside a 200 stream. When the
    engine path cut the request short (`engine.outcome`), that is the answer."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    try:
        result = await getattr(serving, handler)(request, raw)
        if isinstance(result, AsyncIterator):
            result = Started(await anext(result, None), result)
    except Exception as exc:
        outcome = engine.outcome(owner)
        raise (from_exception(exc) if outcome is None else from_outcome(outcome)) from None
    outcome = engine.outcome(owner)
    if outcome is not None:
        if isinstance(result, Started):
            await result.rest.aclose()
        raise from_outcome(outcome)
    if isinstance(result, ErrorResponse):
        raise from_vllm_response(result)
    return result


async def _until_disconnect(raw: Request, work):
    """Run `work`, cancelling it (and so aborting the engine request) if the
    client disconnects first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(raw))
    done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watch.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    raise ClientGone


async def _disconnected(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def read_json(raw: Request, limit: int) -> dict:
    """The body as a JSON object, or the 4xx that says why not."""
    _check_media_type(raw.headers.get("content-type"))
    declared = raw.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body_too_large", f"request body exceeds {limit} bytes")
    body = bytearray()
    try:
        async for part in raw.stream():
            body += part
            if len(body) > limit:
                raise ApiError(413, "body_too_large", f"request body exceeds {limit} bytes")
    except ClientDisconnect:
        if body_timed_out(raw.scope):  # the server cut a stalled upload and answered 408
            raise ApiError(408, "request_timeout",
                           "the request body did not arrive in time") from None
        raise ClientGone from None  # gone mid-upload: the client's doing, not a server error
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_utf8", f"request body is not valid UTF-8: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # nested deeper than the parser goes
        raise ApiError(400, "invalid_json", "request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "request body must be a JSON object")
    return data


def _check_media_type(content_type: str | None) -> None:
    """JSON, or no type at all (as vLLM's server, which parses either). A form or plain
    text type is refused: a browser sends those cross-site without a CORS preflight."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, "unsupported_media_type",
                       f"Content-Type must be application/json, not {media or 'empty'!r}")


def parse_body(validate, body: dict):
    """`validate(body)` (a pydantic model's or TypeAdapter's), its failures as 400s."""
    try:
        return validate(body)
    except ValidationError as exc:
        raise from_validation(exc) from None
    except Exception as exc:  # vLLM's validators raise its own errors directly
        raise from_exception(exc) from None


def _check_limits(request, max_n: int) -> None:
    n = getattr(request, "n", 1) or 1
    if n > max_n:
        raise ApiError(400, "invalid_n", f"n={n} exceeds this server's limit of {max_n}", "n")


def _pin_request_id(raw: Request, request_id: str) -> None:
    """Make vLLM use our id (it reads X-Request-Id), so the response id, engine
    request id and trace-log row agree."""
    headers = [(k, v) for k, v in raw.scope["headers"] if k != b"x-request-id"]
    headers.append((b"x-request-id", request_id.encode("latin-1")))  # as HTTP decoded it
    raw.scope["headers"] = headers
    raw.__dict__.pop("_headers", None)
