"""Workloads for the load generator: open-loop Poisson arrivals and request shapes.

A scenario turns (rate, duration, seed) into a fixed list of `Arrival`s before any
request is sent, so a run is reproducible with `--seed` and the arrival process never
waits on the server (open loop: a slow server does not slow the offered load).

- steady: constant rate;
- ramp: rate rising linearly from 0 to the target over the run;
- burst: the target rate, with a 3x surge through the middle third (seed 000's
  burst test);
- mixed: steady arrivals with bimodal lengths, 70% chat (200-500 prompt tokens) and
  30% documents (up to the model's context).
- surge: burst's shape (`surge_factor`, 3x by default, through the middle third) with
  mixed's lengths.
- diurnal: a day compressed into `period_s`: the rate swings between 10% and 100% of
  the target on a cosine, with 3x bursts of 15 s at random moments, mixed lengths and
  max_tokens from 8 to twice `output_tokens` (what the predictor and the memory
  forecaster train on).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SCENARIOS = ("steady", "ramp", "burst", "mixed", "diurnal", "surge")
MIXED_LENGTHS = ("mixed", "diurnal", "surge")
DIURNAL_FLOOR = 0.1
BURST_S = 15.0
BURSTS_PER_PERIOD = 2
CHAT_TOKENS = (200, 500)
DOCUMENT_SHARE = 0.3
# Common English words: one token each for the embedded tokenizer (measured), about
# 1-1.3 for usual LLM tokenizers. Reports bucket by the server's `usage.prompt_tokens`.
TOKENS_PER_WORD = 1.0
_WORDS = tuple("the of and to in is that for it as with be on not this are by or an from at "
               "which if can when value time list each first new number string return call "
               "data object type file name line error result set order point".split())


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float  # seconds after the run starts
    prompt_words: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Workload:
    scenario: str
    rate: float  # requests/s at full load
    duration_s: float
    max_requests: int
    max_context: int = 4096
    output_tokens: int = 64
    seed: int = 0
    prompt_range: tuple[int, int] = CHAT_TOKENS  # tokens of a chat prompt
    period_s: float = 600.0  # diurnal: one compressed day
    surge_factor: float = 3.0  # burst/surge: the rate through the middle third, x rate

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}")
        if not self.rate > 0 or not self.duration_s > 0 or self.max_requests < 1:
            raise ValueError("rate, duration and max_requests must be positive")
        if self.max_context < 2 * self.output_tokens:
            raise ValueError("max_context is too small for the output tokens")
        if not self.period_s > 0:
            raise ValueError("period_s must be positive")
        if not self.surge_factor >= 1:
            raise ValueError("surge_factor must be >= 1")

    def rate_at(self, t: float) -> float:
        if self.scenario == "ramp":
            return self.rate * t / self.duration_s
        if self.scenario in ("burst", "surge") and (self.duration_s / 3 <= t
                                                     < 2 * self.duration_s / 3):
            return self.surge_factor * self.rate
        if self.scenario == "diurnal":
            day = DIURNAL_FLOOR + (1 - DIURNAL_FLOOR) * (1 - math.cos(2 * math.pi * t
                                                                      / self.period_s)) / 2
            surge = any(start <= t < start + BURST_S for start in self._burst_starts())
            return self.rate * day * (3 if surge else 1)
        return self.rate

    def _burst_starts(self) -> list[float]:
        rng = random.Random(self.seed + 7)
        count = max(1, round(BURSTS_PER_PERIOD * self.duration_s / self.period_s))
        return sorted(rng.uniform(0, self.duration_s) for _ in range(count))

    def arrivals(self) -> list[Arrival]:
        """Poisson arrivals by thinning against the peak rate (exact for any shape)."""
        rng = random.Random(self.seed)
        peak = self.rate * {"burst": self.surge_factor, "surge": self.surge_factor,
                            "diurnal": 3}.get(self.scenario, 1)
        out, t = [], 0.0
        while len(out) < self.max_requests:
            t += rng.expovariate(peak)
            if t >= self.duration_s:
                break
            if rng.random() * peak <= self.rate_at(t):
                out.append(Arrival(t, self._prompt_words(rng), self._max_tokens(rng)))
        return out

    def _max_tokens(self, rng: random.Random) -> int:
        if self.scenario != "diurnal":
            return self.output_tokens
        return int(math.exp(rng.uniform(math.log(8), math.log(2 * self.output_tokens))))

    def _prompt_words(self, rng: random.Random) -> int:
        tokens = rng.randint(*self.prompt_range)
        if self.scenario in MIXED_LENGTHS and rng.random() < DOCUMENT_SHARE:
            # Documents: log-uniform up to the context, leaving room for the output.
            longest = 2 * self.output_tokens if self.scenario == "diurnal" else self.output_tokens
            room = self.max_context - longest - 16
            tokens = int(math.exp(rng.uniform(math.log(CHAT_TOKENS[1]), math.log(room))))
        return max(1, int(tokens / TOKENS_PER_WORD))


def prompt_text(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))
