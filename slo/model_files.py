"""Saved models: one pickle per model, written atomically, read defensively.

A model file is ours, as trusted as the trace DB beside it (pickle runs code on load:
never point tailguard at a model file from elsewhere). A file that is not a model of
the expected kind and format is a ValueError, never a crash.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Final

# Where a server keeps its trained models, and where `tailguard predict|forecast train`
# writes them so that the server beside the same trace DB picks them up.
LATENCY_FILE: Final = "latency.pkl"
FORECAST_FILE: Final = "memory-forecast.pkl"


def default_dir(db: str | Path) -> Path:
    return Path(f"{db}.models")


def save(obj, path: str | Path, kind: str, fmt: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(pickle.dumps({"kind": kind, "format": fmt, "model": obj}))
    tmp.replace(path)  # a reader never sees half a model
    return path


def load(path: str | Path, kind: str, fmt: int):
    try:
        data = pickle.loads(Path(path).read_bytes())
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
            TypeError) as exc:
        raise ValueError(f"{path}: not a readable model file ({exc})") from None
    if not isinstance(data, dict) or (data.get("kind"), data.get("format")) != (kind, fmt):
        raise ValueError(f"{path}: not a tailguard {kind} (format {fmt})")
    return data["model"]
