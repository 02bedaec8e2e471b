"""SLO specs as data: what a spec file holds once `slo.loading` has read and checked it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from slo.durations import format_duration
from slo.targets import Target

LATENCY_SLIS = ("ttft", "tpot", "e2e")
EVENT_SLIS = ("availability", "error_rate")
SLIS = LATENCY_SLIS + EVENT_SLIS
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")  # the `slo` label in metrics and rules


class SpecError(ValueError):
    """An invalid SLO spec; the message names the field and the line."""


@dataclass(frozen=True, slots=True)
class SLO:
    name: str
    sli: str
    objective: float
    window_s: int
    target: Target | None = None
    description: str = ""

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective

    @property
    def window(self) -> str:
        return format_duration(self.window_s)


@dataclass(frozen=True, slots=True)
class SLOSpec:
    service: str
    slos: tuple[SLO, ...]

    def get(self, name: str) -> SLO:
        for slo in self.slos:
            if slo.name == name:
                return slo
        raise KeyError(name)

