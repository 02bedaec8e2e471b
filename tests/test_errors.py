"""What the layers below the HTTP layer return as values, answered: admission's
`Refusal` and the engine's `EngineFailure` become the same 503s as before, with the
trace log's status telling the server's choice (rejected) from a failure (error)."""

from __future__ import annotations

import json

from observe import registry as R
from serving.guard.verdicts import Refusal
from serving.engine.failures import ENGINE_DEAD, ENGINE_HUNG, RETRY_AFTER_S, engine_failure
from serving.errors import from_outcome, from_refusal


def _body(error) -> dict:
    return json.loads(error.response().body)["error"]


def test_a_refusal_is_a_503_the_server_chose():
    refusal = Refusal("shed", "overloaded: request shed", 7)
    error = from_outcome(refusal)
    assert (error.status, error.error_type, error.outcome) == (503, "shed", R.STATUS_REJECTED)
    assert error.headers == {"Retry-After": "7"}
    assert vars(from_refusal(refusal)) == vars(error)
    assert _body(error) == {"message": "overloaded: request shed",
                            "type": "service_unavailable", "param": None, "code": "shed"}


def test_an_engine_failure_is_a_503_error_with_retry_after():
    error = from_outcome(engine_failure(ENGINE_DEAD))
    assert (error.status, error.error_type, error.outcome) == (503, "engine_dead",
                                                               R.STATUS_ERROR)
    assert error.headers == {"Retry-After": str(RETRY_AFTER_S)}
    assert "made no progress for 12 s" in from_outcome(engine_failure(ENGINE_HUNG, 12)).message
