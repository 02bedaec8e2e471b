"""The live memory forecast: KV-cache usage `horizon_s` ahead, refreshed every few
seconds from the engine seconds the server keeps in memory, by whichever model won
the latest backtest.

Until a backtest has run (it needs `min_history_s` of engine_stats) the forecast is
the last value, and `describe()` says so. Re-selection reads the trace log and runs
in a thread; the swap is one assignment.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from datetime import datetime, timedelta, timezone
from pathlib import Path

from observe.stats import EngineSnapshot
from serving.guard.periodic import Periodic
from slo.forecast.forecaster import MemoryForecaster, load_forecaster
from slo.forecast.series import COLUMNS, DEFAULT_HORIZON_S, DEFAULT_STEP_S, Series, series_sql

log = logging.getLogger("tailguard.forecast")
TARGET = "kv_cache_usage"
HISTORY_S = 3600  # engine seconds kept in memory for the live forecast
SERIES_ROWS_MAX = 500_000


def horizon_label(horizon_s: float) -> str:
    return f"{horizon_s / 60:g}m" if horizon_s % 60 == 0 else f"{horizon_s:g}s"


class ForecastService:
    def __init__(self, tracelog, model_path: Path | None, on_forecast=None,
                 horizon_s: float = DEFAULT_HORIZON_S, step_s: float = DEFAULT_STEP_S,
                 refresh_s: float = 15.0, reselect_s: float = 1800.0,
                 min_history_s: float = 2400.0):
        self.tracelog = tracelog
        self.model_path = model_path
        self.on_forecast = on_forecast or (lambda value, label: None)
        self.horizon_s, self.step_s = horizon_s, step_s
        self.refresh_s, self.reselect_s, self.min_history_s = refresh_s, reselect_s, min_history_s
        self.history: deque = deque(maxlen=HISTORY_S)
        self.live: MemoryForecaster | None = self._load()
        self.latest: float | None = None
        self.latest_at: float | None = None
        self.last_error: str | None = None
        self._next_refresh = 0.0
        self._periodic: Periodic | None = None

    def _load(self) -> MemoryForecaster | None:
        if self.model_path and self.model_path.exists():
            try:
                return load_forecaster(self.model_path)
            except (ValueError, OSError, EOFError, AttributeError) as exc:
                log.warning("ignoring memory forecaster %s: %s", self.model_path, exc)
        return None

    @property
    def label(self) -> str:
        return horizon_label(self.horizon_s)

    def observe(self, snap: EngineSnapshot, epoch: float) -> None:
        """Called once a second with the engine's second; refreshes the forecast
        every `refresh_s`."""
        self.history.append((epoch, *(getattr(snap, c) or 0 for c in COLUMNS)))
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + self.refresh_s
            self.refresh()

    def refresh(self) -> float | None:
        if not self.history:
            return None
        series = Series.from_rows(list(self.history), self.step_s)
        try:
            value = (self.live.forecast_latest(series) if self.live is not None
                     else float(series.column(TARGET)[-1]))
        except Exception as exc:  # a model that cannot run falls back, never breaks the loop
            self.last_error = f"{type(exc).__name__}: {exc}"
            value = float(series.column(TARGET)[-1])
        self.latest, self.latest_at = value, time.time()
        self.on_forecast(value, self.label)
        self._record(value)
        return value

    def _record(self, value: float) -> None:
        made = datetime.fromtimestamp(self.latest_at, timezone.utc)
        self.tracelog.add("forecasts", {
            "ts": made, "target_ts": made + timedelta(seconds=self.horizon_s),
            "target": TARGET, "horizon_s": self.horizon_s, "value": value,
            "model": self.live.model.name if self.live else "last_value"})

    # --- model selection -------------------------------------------------------------

    def start(self) -> None:
        self._periodic = Periodic("tailguard-forecast", self.reselect_s, self.reselect)
        self._periodic.start()

    def reselect(self) -> dict:
        """Backtest every model on the trace log's engine seconds and run the winner."""
        try:
            self.tracelog.flush()
            since = time.time() - 24 * 3600
            rows = self.tracelog.query(series_sql(since), max_rows=SERIES_ROWS_MAX,
                                       timeout_s=60).rows
            series = Series.from_rows(rows, self.step_s)
            if len(series) * self.step_s < self.min_history_s:
                return {"selected": False, "history_s": len(series) * self.step_s,
                        "needed_s": self.min_history_s}
            import torch

            torch.set_num_threads(1)  # leave the other cores to serving
            chosen = MemoryForecaster.select(series, TARGET, self.horizon_s)
            if self.model_path:
                chosen.save(self.model_path)
            self.live, self.last_error = chosen, None
            log.info("memory forecaster: %s won the backtest", chosen.model.name)
            return {"selected": True, **chosen.backtest.describe()}
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("memory forecaster selection failed")
            return {"selected": False, "error": self.last_error}

    def describe(self) -> dict:
        live = self.live
        return {"target": TARGET, "horizon_s": self.horizon_s, "step_s": self.step_s,
                "model": live.model.name if live else "last_value",
                "backtest": live.backtest.describe() if live else None,
                "fitted_at": live.fitted_at if live else None,
                "forecast": self.latest, "forecast_at": self.latest_at,
                "last_error": self.last_error}

    def stop(self) -> None:
        if self._periodic is not None:
            self._periodic.stop()

