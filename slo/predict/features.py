"""The latency predictor's inputs, and its training data as read from the trace log.

Every feature is known at admission time and is a column of `requests` (the server
writes the load it saw next to each request), so a model trained from the trace log
sees exactly what the live predictor sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from observe import registry as R

FEATURES: Final = (
    "prompt_tokens", "max_tokens", "queue_depth", "running_requests", "kv_cache_usage",
    "recent_step_s", "pending_requests", "pending_prefill_tokens", "batch_priority",
    "tokenize_s",  # already spent before admission (parsing, chat template, tokenizer)
)
TARGETS: Final = ("ttft_s", "tpot_s")

_SELECT: Final = ", ".join(
    f"CASE WHEN priority = '{R.PRIORITY_BATCH}' THEN 1 ELSE 0 END AS batch_priority"
    if name == "batch_priority" else f"coalesce({name}, 0) AS {name}" for name in FEATURES)


def training_sql(since: str | None = None) -> str:
    """Served requests with their admission load, oldest first. `since` is a
    TIMESTAMPTZ literal bounding the window (a retrain looks at recent traffic)."""
    where = [f"status = '{R.STATUS_OK}'", "ttft_s IS NOT NULL", "queue_depth IS NOT NULL"]
    if since:
        where.append(f"arrival_ts >= TIMESTAMPTZ '{since}'")
    return (f"SELECT {_SELECT}, ttft_s, tpot_s, epoch(arrival_ts) AS arrival "
            f"FROM requests WHERE {' AND '.join(where)} ORDER BY arrival_ts")


@dataclass(frozen=True, slots=True)
class TrainingSet:
    X: np.ndarray  # (rows, len(FEATURES))
    ttft_s: np.ndarray
    tpot_s: np.ndarray  # NaN where a request made fewer than two tokens
    arrival: np.ndarray  # epoch seconds

    def __len__(self) -> int:
        return len(self.X)

    @classmethod
    def from_rows(cls, rows: list[tuple]) -> "TrainingSet":
        """Rows in `training_sql`'s column order."""
        n = len(FEATURES)
        data = np.array(rows, dtype=np.float64).reshape(len(rows), n + 3)
        return cls(data[:, :n], data[:, n], data[:, n + 1], data[:, n + 2])

    def split(self, holdout: float) -> tuple["TrainingSet", "TrainingSet"]:
        """Older part for training, the newest `holdout` share held out (no shuffling:
        a model is always judged on traffic that came after its training data)."""
        if not 0 < holdout < 1:
            raise ValueError("holdout must be between 0 and 1")
        cut = int(len(self) * (1 - holdout))
        return self.slice(0, cut), self.slice(cut, len(self))

    def slice(self, start: int, stop: int) -> "TrainingSet":
        return TrainingSet(self.X[start:stop], self.ttft_s[start:stop],
                           self.tpot_s[start:stop], self.arrival[start:stop])

    @property
    def window(self) -> tuple[float, float]:
        return (float(self.arrival[0]), float(self.arrival[-1])) if len(self) else (0.0, 0.0)


# Derived inputs appended to FEATURES before the trees see them. Trees split one
# feature at a time, so a sum they need is given to them: the prefill work this request
# waits for is its own prompt plus everything admitted before it without a first token.
DERIVED: Final = ("work_ahead_tokens", "decode_load_s")


def design(X: np.ndarray) -> np.ndarray:
    """FEATURES columns -> FEATURES + DERIVED columns (rows of one request each)."""
    col = {name: X[:, j] for j, name in enumerate(FEATURES)}
    work = col["prompt_tokens"] + col["pending_prefill_tokens"]
    decode = col["running_requests"] * col["recent_step_s"]
    return np.column_stack([X, work, decode])


def feature_vector(prompt_tokens: int, max_tokens: int, load, batch: bool,
                   tokenize_s: float = 0.0) -> list[float]:
    """One request's row, in FEATURES order; `load` is an `AdmissionLoad`."""
    return [prompt_tokens, max_tokens, load.queue_depth, load.running_requests,
            load.kv_cache_usage, load.recent_step_s, load.pending_requests,
            load.pending_prefill_tokens, 1.0 if batch else 0.0, tokenize_s]
