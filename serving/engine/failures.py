"""What an engine failure means to the requests on it: the kinds of fault, the
watchdog's timeout, and the 503 each request in flight gets (`ObservedEngine`
in `serving/engine/observed.py` detects them)."""

from __future__ import annotations

from observe import settings
from observe.settings import TAILGUARD_ENGINE_HANG_S
from serving.errors import ApiError

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


def engine_fault_error(fault: str, hang_s: float = 0.0) -> ApiError:
    """What a request in flight gets when the engine fails under it."""
    if fault == ENGINE_HUNG:
        message = (f"the engine made no progress for {hang_s:g} s and is being "
                   f"restarted; retry shortly")
    elif fault == ENGINE_SHUTDOWN:
        message = "the engine was shut down while serving this request; retry shortly"
    else:
        message = "the engine failed while serving this request and is being restarted; " \
                  "retry shortly"
    return ApiError(503, fault, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def is_engine_dead(exc: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(exc, EngineDeadError)
