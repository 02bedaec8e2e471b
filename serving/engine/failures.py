"""What an engine failure means to the requests on it: the kinds of fault, the
watchdog's timeout, and the `EngineFailure` each request in flight ends with
(`ObservedEngine` in `serving/engine/observed.py` detects them; the HTTP layer
answers each with a 503)."""

from __future__ import annotations

from dataclasses import dataclass

from observe import settings
from observe.settings import TAILGUARD_ENGINE_HANG_S

# The engine watchdog: requests in flight and no engine step (nor output) for this
# long means the engine core is hung. 0 turns the watchdog off.
DEFAULT_ENGINE_HANG_S = 60.0  # longer than any first-use kernel compile seen here
ENGINE_DEAD = "engine_dead"
ENGINE_HUNG = "engine_hung"
ENGINE_SHUTDOWN = "engine_shutdown"  # shut down (a restart, a server stop) under requests
RETRY_AFTER_S = 10


def engine_hang_s() -> float:
    """The watchdog's timeout: `TAILGUARD_ENGINE_HANG_S`, else the default."""
    return settings.number_or_default(TAILGUARD_ENGINE_HANG_S, DEFAULT_ENGINE_HANG_S,
                                      valid=lambda value: value >= 0,  # also rejects NaN
                                      want="seconds >= 0")


@dataclass(frozen=True, slots=True)
class EngineFailure:
    """Why the engine ended a request it was serving: the fault (also the row's error
    type), what to tell the client, and when it may come back."""

    fault: str  # ENGINE_DEAD, ENGINE_HUNG or ENGINE_SHUTDOWN
    message: str
    retry_after_s: int = RETRY_AFTER_S


def engine_failure(fault: str, hang_s: float = 0.0) -> EngineFailure:
    """What a request in flight ends with when the engine fails under it."""
    if fault == ENGINE_HUNG:
        message = (f"the engine made no progress for {hang_s:g} s and is being "
                   f"restarted; retry shortly")
    elif fault == ENGINE_SHUTDOWN:
        message = "the engine was shut down while serving this request; retry shortly"
    else:
        message = "the engine failed while serving this request and is being restarted; " \
                  "retry shortly"
    return EngineFailure(fault, message)


def is_engine_dead(exc: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(exc, EngineDeadError)
