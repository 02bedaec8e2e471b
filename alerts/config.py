"""What the generated rules depend on besides the SLO spec, checked on construction."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_JOB = "tailguard"
# Runbook links point at docs/alerts.md; deployments that host the docs pass a URL.
DEFAULT_RUNBOOK_BASE = "docs/alerts.md"
# `sloth_slo_info` labels: who generated the rules and from what kind of spec.
SLOTH_MODE = "cli-gen-prom"
SLOTH_SPEC = "tailguard/v1"
_JOB = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True, slots=True)
class RuleConfig:
    job: str = DEFAULT_JOB  # Prometheus scrape job of the tailguard servers
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    version: str = "tailguard-v1"  # `sloth_version`; bump when the rule layout changes

    def __post_init__(self) -> None:
        if not _JOB.match(self.job):
            raise ValueError(f"job: {self.job!r} is not a plain Prometheus job name")
        if not self.runbook_base or any(c in self.runbook_base for c in ' "#{}'):
            raise ValueError(f"runbook_base: {self.runbook_base!r} must be a URL without spaces,"
                             " quotes, braces or '#'")

    def runbook(self, alert: str) -> str:
        """The runbook URL of `alert`: its section of docs/alerts.md."""
        return f"{self.runbook_base}#{alert.lower()}"
