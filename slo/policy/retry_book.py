"""Bookings for refused requests: a `Retry-After` that is a promise, not a guess.

A request refused by the deadline check is told to come back once the work ahead of
it has drained. In a surge that alone fails: every refusal names about the same
moment, the surge's new arrivals fill the drained engine first, and the returning
requests are refused again. So each refusal books the engine time its prompt will
need, after the drain and after every booking before it (refused requests come back
one after another, not together), and until the booking is claimed or lapses its
prompt counts as work ahead of every newcomer due after its start: a newcomer that
would take the promised time is refused in its turn.

A booking is claimed by the next request of the same client with the same prompt
length that arrives in its window (from a second before the time given to
`grace_s` after it); the claimant's deadline check does not count the bookings (it
is the one they were kept for). A booking nobody claims lapses at the window's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from observe import registry as R
from slo.sim.engine_model import attention_pairs

EARLY_S: Final = 1.0  # a client's clock and rounding: a retry may come this much early
DEFAULT_GRACE_S: Final = 3.0
RETRY_BOOKED: Final = "retry:booked"  # the policy action of a request back for its booking


@dataclass(slots=True)
class Booking:
    key: tuple[str | None, int]  # client, prompt tokens
    start: float  # monotonic time the client was told to come back
    tokens: int
    lane: str = R.PRIORITY_REALTIME  # the lane it was refused from
    target_s: float = math.inf  # its first-token target: due at start + target_s

    @property
    def deadline(self) -> float:
        """When the retry's first token is due if it comes back on time."""
        return self.start + self.target_s


class RetryBook:
    def __init__(self, grace_s: float = DEFAULT_GRACE_S, max_retry_after_s: int = 120):
        self.grace_s = grace_s
        self.max_retry_after_s = max_retry_after_s
        self._bookings: list[Booking] = []
        self._free_at = 0.0  # when the engine time booked so far ends

    def __len__(self) -> int:
        return len(self._bookings)

    def book(self, client: str | None, tokens: int, now: float, drain_s: float,
             own_s: float, lane: str = R.PRIORITY_REALTIME, target_s: float = math.inf) -> int:
        """Book a refused request's `own_s` of engine time after the `drain_s` of the
        work ahead of it and after the bookings before it; returns its Retry-After
        (whole seconds, at least 1). `lane` and `target_s`: what it will come back as
        (the promise keeper protects its first token)."""
        self._lapse(now)
        start = max(now + drain_s, self._free_at)  # infinite: nothing frees room lately
        retry_after = self.max_retry_after_s if not math.isfinite(start) else \
            min(self.max_retry_after_s, max(1, math.ceil(start - now)))
        self._free_at = max(self._free_at, now + retry_after) + own_s
        self._bookings.append(Booking((client, tokens), now + retry_after, tokens, lane,
                                      target_s))
        return retry_after

    def claim(self, client: str | None, tokens: int, now: float) -> bool:
        """Whether this request comes back for a booking (which it then uses up)."""
        self._lapse(now)
        for i, booking in enumerate(self._bookings):
            if booking.key == (client, tokens) and now >= booking.start - EARLY_S:
                del self._bookings[i]
                return True
        return False

    def work_due(self, now: float, deadline: float) -> tuple[int, int]:
        """Prompt tokens booked to come back before `deadline`: work ahead of a
        newcomer due then; and their attention pairs (fresh prompts)."""
        self._lapse(now)
        due = [b.tokens for b in self._bookings if b.start - EARLY_S <= deadline]
        return sum(due), sum(attention_pairs(0, tokens) for tokens in due)

    def coming(self, now: float, deadline: float) -> list[Booking]:
        """The bookings still open whose retries are due before `deadline`."""
        self._lapse(now)
        return [b for b in self._bookings if b.deadline < deadline]

    def _lapse(self, now: float) -> None:
        if self._bookings and self._bookings[0].start + self.grace_s < now:
            self._bookings = [b for b in self._bookings if b.start + self.grace_s >= now]
        if not self._bookings:
            self._free_at = min(self._free_at, now)
