"""Seed 000's length classes: short, medium and long prompts, with boundaries that follow
the traffic.

The seed buckets requests by prompt length (0-256, 256-512, 512+ tokens to start) and
re-buckets every 5 s from the 25th and 75th percentiles of the lengths seen in that
window, each boundary moving at most 20% at a time, so one odd window cannot swing
the classes. A window with fewer than `min_samples` prompts leaves them where they
are: two or three requests say nothing about a distribution, and an idle server
should not drift.

Every request is classed by the boundaries in force when it arrives (its trace-log row
keeps them: `length_class_low`, `length_class_high`), and the boundaries are a gauge
(`tailguard_length_class_bound_tokens`). What the classes are used for: observation
always; ordering the limiter's lanes short class first only when the
`length_class_order` policy setting asks for it (the measurement that decided its
default is in docs/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from observe.registry import BATCH_BUCKET_BOUNDS

WINDOW_S: Final = 5.0
MAX_MOVE: Final = 0.2
MIN_SAMPLES: Final = 8
CLASS_NAMES: Final = ("short", "medium", "long")


def clamped(current: int, target: float, max_move: float = MAX_MOVE) -> int:
    """`target`, moved to at most `max_move` of `current` away from it (whole tokens)."""
    low, high = current * (1 - max_move), current * (1 + max_move)
    return max(1, round(min(high, max(low, target))))


def rebucket(bounds: tuple[int, int], lengths: list[int],
             max_move: float = MAX_MOVE) -> tuple[int, int]:
    """The seed's rule: the window's p25 and p75, each clamped to +-`max_move` of the
    boundary it replaces; the high boundary stays above the low one."""
    p25, p75 = np.percentile(lengths, (25, 75))  # as the seed computes them
    low = clamped(bounds[0], float(p25), max_move)
    high = clamped(bounds[1], float(p75), max_move)
    return low, max(high, low + 1)


def class_of(tokens: int, bounds: tuple[int, int]) -> int:
    """0 short (up to the low boundary), 1 medium (up to the high one), 2 long."""
    return 0 if tokens <= bounds[0] else 1 if tokens <= bounds[1] else 2


@dataclass(slots=True)
class LengthClasses:
    """The live boundaries. `observe` a prompt's length as it is admitted; it returns
    the boundaries that class it (those in force before it arrived)."""

    bounds: tuple[int, int] = BATCH_BUCKET_BOUNDS
    window_s: float = WINDOW_S
    max_move: float = MAX_MOVE
    min_samples: int = MIN_SAMPLES
    moves: int = 0  # re-bucketings that changed a boundary
    _window_end: float | None = None
    _lengths: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.bounds[0] < self.bounds[1]:
            raise ValueError("length class bounds must be 0 < low < high")
        if self.window_s <= 0 or not 0 < self.max_move < 1 or self.min_samples < 1:
            raise ValueError("length classes need window_s > 0, 0 < max_move < 1 and "
                             "min_samples >= 1")

    def observe(self, tokens: int, now: float) -> tuple[int, int]:
        self.roll(now)
        in_force = self.bounds
        self._lengths.append(tokens)
        return in_force

    def roll(self, now: float) -> None:
        """Close the window if it is over: re-bucket from it, start the next one at the
        next window boundary after `now` (idle windows pass without a move)."""
        if self._window_end is None:
            self._window_end = now + self.window_s
            return
        if now < self._window_end:
            return
        if len(self._lengths) >= self.min_samples:
            moved = rebucket(self.bounds, self._lengths, self.max_move)
            self.moves += moved != self.bounds
            self.bounds = moved
        self._lengths.clear()
        behind = math.floor((now - self._window_end) / self.window_s) + 1
        self._window_end += behind * self.window_s
