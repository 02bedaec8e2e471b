"""Latency targets as a function of context length, in Python and in SQL.

Three shapes, all positive and monotone in the context length:
- `ContextTarget` (seed 003, with SPEC §3's clamp):
  target(ctx) = base(ctx) * (1 + max(0, log2(ctx / breakpoint))), base = 200 ms up to
  the breakpoint (1024 tokens) and 500 ms above it. The seed's unclamped log term goes
  negative below 512 tokens; clamping keeps every target positive.
- `FixedTarget`: one threshold for every length.
- `TableTarget`: a step per context range, e.g. seed 003's first-token health check
  (p99 at 4k < 300 ms, at 32k < 800 ms).
Each also renders itself as a SQL expression over a prompt-length column, so budgets
computed in DuckDB judge requests exactly as the server did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _finite(*values) -> bool:
    try:
        return all(math.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        return False


def _lit(seconds: float) -> str:
    """A DOUBLE literal: DuckDB would read 0.3 as DECIMAL."""
    return f"{float(seconds)!r}::DOUBLE"


@dataclass(frozen=True, slots=True)
class ContextTarget:
    short_base_s: float = 0.2
    long_base_s: float = 0.5
    breakpoint_tokens: int = 1024

    def __post_init__(self) -> None:
        if not _finite(self.short_base_s, self.long_base_s, self.breakpoint_tokens):
            raise ValueError("targets must be finite numbers")
        if not 0 < self.short_base_s <= self.long_base_s:
            raise ValueError("short_base_s must be > 0 and <= long_base_s")
        if self.breakpoint_tokens < 1:
            raise ValueError("breakpoint_tokens must be >= 1")

    def __call__(self, context_tokens: int) -> float:
        """Target in seconds for a prompt of `context_tokens` tokens."""
        ctx = max(int(context_tokens), 0)
        base = self.short_base_s if ctx <= self.breakpoint_tokens else self.long_base_s
        growth = max(0.0, math.log2(max(ctx, 1) / self.breakpoint_tokens))
        return base * (1.0 + growth)

    def sql(self, ctx: str) -> str:
        # Above the breakpoint the log term is positive, so the clamp is not needed
        # there; writing it this way makes the expression 3-4x cheaper per row.
        bp = self.breakpoint_tokens
        return (f"(CASE WHEN {ctx} <= {bp} THEN {_lit(self.short_base_s)} "
                f"ELSE {_lit(self.long_base_s)} * (1 + log2({ctx} / {bp})) END)")


@dataclass(frozen=True, slots=True)
class FixedTarget:
    seconds: float

    def __post_init__(self) -> None:
        if not _finite(self.seconds) or not self.seconds > 0:
            raise ValueError("seconds must be a finite number > 0")

    def __call__(self, context_tokens: int) -> float:
        return self.seconds

    def sql(self, ctx: str) -> str:
        return _lit(self.seconds)


@dataclass(frozen=True, slots=True)
class TableTarget:
    """Steps `(max_tokens, seconds)`, ascending; the last step covers everything
    longer (its max_tokens may be None)."""

    steps: tuple[tuple[int | None, float], ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("steps must not be empty")
        bounds = [b for b, _ in self.steps[:-1]]
        if any(b is None for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError("max_tokens must increase and only the last may be open")
        seconds = [s for _, s in self.steps]
        if not _finite(*seconds, *(b for b in bounds)):
            raise ValueError("steps must be finite numbers")
        if any(s <= 0 for s in seconds) or seconds != sorted(seconds):
            raise ValueError("seconds must be positive and not decrease with context")

    def __call__(self, context_tokens: int) -> float:
        for bound, seconds in self.steps:
            if bound is None or context_tokens <= bound:
                return seconds
        return self.steps[-1][1]

    def sql(self, ctx: str) -> str:
        cases = " ".join(f"WHEN {ctx} <= {b} THEN {_lit(s)}" for b, s in self.steps if b is not None)
        last = _lit(self.steps[-1][1])
        return f"(CASE {cases} ELSE {last} END)" if cases else last


Target = ContextTarget | FixedTarget | TableTarget

DEFAULT_TTFT_TARGET = ContextTarget()
# Seed 003's first-token health check, as a table.
FIRST_TOKEN_HEALTH = TableTarget(((4096, 0.3), (None, 0.8)))
