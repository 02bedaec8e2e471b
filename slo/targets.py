"""Context-aware latency targets (seed 003, with SPEC §3's clamp).

target(ctx) = base(ctx) * (1 + max(0, log2(ctx / breakpoint)))
with base = 200 ms up to the breakpoint (1024 tokens) and 500 ms above it. The seed's
unclamped log term goes negative below 512 tokens; clamping keeps every target
positive and the function monotone in the context length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ContextTarget:
    short_base_s: float = 0.2
    long_base_s: float = 0.5
    breakpoint_tokens: int = 1024

    def __post_init__(self) -> None:
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


DEFAULT_TTFT_TARGET = ContextTarget()
