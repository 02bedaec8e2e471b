"""Saved models: one pickle per model, written atomically, read defensively.

A model file is ours, as trusted as the trace DB beside it (pickle runs code on load:
never point tailguard at a model file from elsewhere). A file that is not a model of
the expected kind and format is a ValueError, never a crash.
"""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path
from typing import Final

# Where a server keeps its trained models, and where `tailguard predict|forecast train`
# writes them so that the server beside the same trace DB picks them up.
LATENCY_FILE: Final = "latency.pkl"
FORECAST_FILE: Final = "memory-forecast.pkl"


# Modules a saved model may name from before the package split: a model trained then
# still loads. Each old module maps to the modules its classes live in now.
MOVED: Final = {
    "slo.backtest": ("slo.forecast.forecaster", "slo.forecast.backtest"),
    "slo.baselines": ("slo.forecast.baselines",),
    "slo.lstm": ("slo.forecast.lstm",),
    "slo.series": ("slo.forecast.series",),
    "slo.predictor": ("slo.predict.model",),
    "slo.forest": ("slo.predict.forest",),
    "slo.features": ("slo.predict.features",),
    "slo.modelfile": ("slo.model_files",),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        for moved_to in MOVED.get(module, ()):
            found = getattr(importlib.import_module(moved_to), name, None)
            if found is not None:
                return found
        return super().find_class(module, name)


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
        data = _Unpickler(io.BytesIO(Path(path).read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
            TypeError) as exc:
        raise ValueError(f"{path}: not a readable model file ({exc})") from None
    if not isinstance(data, dict) or (data.get("kind"), data.get("format")) != (kind, fmt):
        raise ValueError(f"{path}: not a tailguard {kind} (format {fmt})")
    return data["model"]
