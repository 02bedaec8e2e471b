"""Fault injection for tests and drills: make the real engine slow, stall or fail.

Off unless the server starts with `--enable-fault-injection`; then
`PUT /admin/faults {"mode": ..., ...}` (token-protected) sets one of:

- `slow`: every engine request first waits `delay_s`;
- `stall`: engine requests wait until the fault is cleared (or `timeout_s`);
- `error`: engine requests fail with an engine error (what the breaker L2 sees);
- `block_loop`: the server's event loop is blocked once for `delay_s` (at most
  10 s), as a slow callback would: what the event-loop lag metric must show;
- `none`: clear.

The fault sits in the engine client wrapper, in front of the real engine, so the
whole server path (admission, spans, trace rows, policies) runs exactly as in a
real incident.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Final

MODES: Final = ("none", "slow", "stall", "error", "block_loop")
MAX_BLOCK_S: Final = 10.0


class InjectedEngineError(RuntimeError):
    """The engine 'failed' (injected)."""


@dataclass(frozen=True, slots=True)
class Fault:
    mode: str = "none"
    delay_s: float = 0.0
    timeout_s: float = 60.0
    since: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if not 0 <= self.delay_s <= 600 or not 0 < self.timeout_s <= 600:
            raise ValueError("delay_s must be in [0, 600] and timeout_s in (0, 600]")
        if self.mode == "block_loop" and self.delay_s > MAX_BLOCK_S:
            raise ValueError(f"block_loop: delay_s must be at most {MAX_BLOCK_S:g}")

    def as_dict(self) -> dict:
        return {"mode": self.mode, "delay_s": self.delay_s, "timeout_s": self.timeout_s,
                "since": self.since}


class FaultInjector:
    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.fault = Fault()
        self._cleared = asyncio.Event()
        self.on_set: Callable[[], None] | None = None  # told of every new fault

    def set(self, mode: str, delay_s: float = 0.0, timeout_s: float = 60.0) -> Fault:
        if not self.enabled:
            raise PermissionError("fault injection is off (start with --enable-fault-injection)")
        fault = Fault(mode, delay_s, timeout_s, time.time())
        if mode == "block_loop":  # once, right after this answer; nothing stays set
            asyncio.get_running_loop().call_later(0.05, time.sleep, delay_s)
            return fault
        self.fault = fault
        if mode == "none":
            self._cleared.set()
        else:
            self._cleared = asyncio.Event()
        if self.on_set is not None:
            self.on_set()
        return self.fault

    @property
    def failing(self) -> bool:
        return self.fault.mode == "error"

    async def before_engine(self) -> None:
        """Called before each engine request."""
        fault = self.fault
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay_s)
        elif fault.mode == "stall":
            try:
                await asyncio.wait_for(self._cleared.wait(), fault.timeout_s)
            except asyncio.TimeoutError:
                pass
        elif fault.mode == "error":
            raise InjectedEngineError("injected engine failure")
