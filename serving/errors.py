"""OpenAI-style errors: one exception type, one JSON shape, one classification table.

Every rejection names an `error_type` (a stable short code that lands in the trace
log and in `tailguard_request_errors_total`) beside the human message. What the layers
below return as values (admission's `Refusal`, the engine's `EngineFailure`) becomes
an `ApiError` here, and only here.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from observe import registry as R
from serving.guard.verdicts import Refusal
from serving.engine.failures import EngineFailure

# OpenAI's `error.type` per HTTP status.
_OPENAI_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
    408: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
    422: "invalid_request_error", 429: "rate_limit_error", 431: "invalid_request_error",
    499: "client_closed_request", 503: "service_unavailable", 500: "server_error",
}

# vLLM validation errors name the offending parameter; we name the failure.
_PARAMETER_TYPES = {
    "input_tokens": "context_length_exceeded",
    "max_tokens": "invalid_max_tokens",
    "max_completion_tokens": "invalid_max_tokens",
    "prompt": "empty_prompt",
    "messages": "invalid_messages",
}


class ApiError(Exception):
    """A request we refuse (4xx) or fail (5xx), with everything the row needs."""

    def __init__(self, status: int, error_type: str, message: str,
                 param: str | None = None, headers: dict | None = None,
                 shed: bool = False):
        super().__init__(message)
        self.status, self.error_type, self.message = status, error_type, message
        self.param, self.headers, self.shed = param, headers, shed

    @property
    def outcome(self) -> str:
        """The trace log's `status` column: a policy's 503 is a rejection (the server
        chose it), not an error."""
        return R.STATUS_ERROR if self.status >= 500 and not self.shed else R.STATUS_REJECTED

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message,
                          "type": _OPENAI_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.error_type}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def engine_not_ready() -> ApiError:
    """No engine to serve with (starting, or restarting under breaker L2)."""
    return ApiError(503, "engine_not_ready", "the engine is not ready",
                    headers={"Retry-After": "5"})


def key_required() -> ApiError:
    return ApiError(401, "invalid_api_key", "a valid API key is required")


def from_refusal(refusal: Refusal) -> ApiError:
    """Admission's refusal -> its status (503, or 429 from the deadline check) with
    Retry-After: a rejection (the server chose it)."""
    return ApiError(refusal.status, refusal.reason, refusal.message,
                    headers={"Retry-After": str(refusal.retry_after_s)}, shed=True)


def from_outcome(outcome: Refusal | EngineFailure) -> ApiError:
    """Why the engine path cut a request short (`ObservedEngine.outcome`) -> 503: the
    engine failing under it is an error, admission refusing it is not."""
    if isinstance(outcome, Refusal):
        return from_refusal(outcome)
    return ApiError(503, outcome.fault, outcome.message,
                    headers={"Retry-After": str(outcome.retry_after_s)})


def from_vllm_validation(exc) -> ApiError:
    """`VLLMValidationError`/`ValueError` raised by vLLM's serving code -> 400."""
    param = getattr(exc, "parameter", None)
    error_type = _PARAMETER_TYPES.get(param, "invalid_request")
    if param == "prompt" and "exceeds the maximum" in str(exc):
        error_type = "too_many_prompts"  # vLLM's list cap: not an empty prompt
    return ApiError(400, error_type, str(exc), param)


def from_exception(exc: Exception) -> ApiError:
    """Any exception out of vLLM's serving code, by vLLM's own error hierarchy."""
    from vllm import exceptions as E

    if isinstance(exc, E.VLLMNotFoundError):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, E.VLLMUnprocessableEntityError):
        return ApiError(422, "unprocessable_entity", str(exc))
    if isinstance(exc, (E.VLLMClientError, ValueError, TypeError, OverflowError)):
        return from_vllm_validation(exc)
    if isinstance(exc, E.GracefulHTTPError):
        status = int(exc.http_status)
        return ApiError(status, "engine_overloaded" if status in (429, 503) else "engine_error",
                        str(exc))
    status = int(getattr(exc, "status_code", 500))
    return ApiError(status, "engine_error", f"engine failed: {exc}")


def from_vllm_response(error_response) -> ApiError:
    """vLLM's own `ErrorResponse` (e.g. unknown model) -> ApiError."""
    err = error_response.error
    status = int(err.code)
    if status == 404:
        error_type = "model_not_found"
    elif status >= 500:
        error_type = "engine_error"
    else:
        error_type = _PARAMETER_TYPES.get(err.param, "invalid_request")
    return ApiError(status, error_type, err.message, err.param)


def from_validation(exc) -> ApiError:
    """A pydantic `ValidationError` on the request body -> 400 naming each field."""
    problems = []
    for item in exc.errors()[:5]:
        where = ".".join(_plain(item.get("loc", ()))) or "body"
        problems.append(f"{where}: {item.get('msg')}")
    first = exc.errors()[0].get("loc", ()) if exc.errors() else ()
    param = ".".join(_plain(first)) or None
    return ApiError(400, "validation_error", "; ".join(problems), param)


def _plain(loc) -> list[str]:
    """A field's path without pydantic's validator wrappers (a union member reads
    `function-wrap[__log_extra_fields__()]`, which names no field)."""
    return [str(p) for p in loc if not str(p).startswith("function-")]
