"""OpenAI's Responses API (`POST /v1/responses`) on vLLM's own serving class, shaped
for tailguard's generation path (`serving.generation`): the same admission, record,
spans and verdict as chat and completions.

Two things differ from chat. vLLM's Responses stream yields event objects, which its
router encodes as named SSE events (`event: <type>`); here that encoding happens
before the stream reaches the observed path. And the stream opens with
`response.created` and `response.in_progress` before the engine has been asked at all,
so those are held back until the engine answers: admission (which runs when the engine
is first asked) can still refuse with a real status code, and the client's first
byte still means its first token, as on the other routes."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from observe import registry as R
from serving.engine.observed import current_request
from serving.errors import from_exception, from_outcome

log = logging.getLogger("tailguard")
LEAD_EVENTS = frozenset({"response.created", "response.in_progress"})
ERROR_EVENT = "error"


class ResponsesServing:
    """vLLM's `OpenAIServingResponses` as the generation path calls it: a
    `ResponsesResponse`, vLLM's `ErrorResponse`, or a stream of SSE text whose lead
    events wait for the engine's first answer."""

    def __init__(self, serving, engine):
        self.serving = serving  # vLLM's OpenAIServingResponses
        self.engine = engine  # the observed engine it generates on

    async def create_responses(self, request, raw):
        result = await self.serving.create_responses(request, raw)
        if not isinstance(result, AsyncIterator):
            return result
        held = []
        async for event in result:  # an admission refusal raises here, before any byte
            held.append(event)
            if event.type not in LEAD_EVENTS:
                break
        return self._sse(held, result)

    async def _sse(self, held: list, rest: AsyncIterator) -> AsyncIterator[str]:
        """vLLM's router's encoding; a failure inside the started stream becomes an
        `error` event (the record failed with it) instead of a cut connection."""
        sequence = -1
        try:
            for event in held:
                sequence = getattr(event, "sequence_number", sequence)
                yield self._encode(event)
            async for event in rest:
                sequence = getattr(event, "sequence_number", sequence)
                yield self._encode(event)
        except Exception as exc:
            yield self._failed(exc, sequence + 1)
        finally:
            await rest.aclose()

    def _encode(self, event) -> str:
        if event.type == ERROR_EVENT:  # vLLM's own report of a failed generation
            _fail(500, "engine_error", getattr(event, "message", "generation failed"))
        data = event.model_dump_json(indent=None, by_alias=True)
        return f"event: {event.type}\ndata: {data}\n\n"

    def _failed(self, exc: Exception, sequence: int) -> str:
        rec = current_request.get()
        outcome = self.engine.outcome(rec.request_id) if rec is not None else None
        error = from_exception(exc) if outcome is None else from_outcome(outcome)
        if outcome is None and error.status >= 500:
            log.error("responses stream failed: %s: %s", type(exc).__name__, exc)
        _fail(error.status, error.error_type, error.message, error.outcome)
        event = {"type": ERROR_EVENT, "code": error.error_type, "message": error.message,
                 "param": error.param, "sequence_number": sequence}
        return f"event: {ERROR_EVENT}\ndata: {json.dumps(event)}\n\n"


def _fail(status: int, error_type: str, message: str, outcome: str = R.STATUS_ERROR) -> None:
    rec = current_request.get()
    if rec is not None and rec.error_type is None:
        rec.fail(status, error_type, message, outcome)
