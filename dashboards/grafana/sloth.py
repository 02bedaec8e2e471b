"""The SLO recording rules the SLO panels read, under Sloth's names.

`tailguard rules` records every SLO of the spec the way Sloth (https://sloth.dev)
does, so these names and labels are Sloth's own: one series per SLO, labelled
`sloth_service` (the spec's service), `sloth_slo` (the SLO's name) and `sloth_id`.
Series are read with `max by (sloth_slo)`, which keeps one series per SLO and drops
any extra label (Sloth adds `sloth_window` to the SLI rules) without ever adding two
series together.
"""

from __future__ import annotations

from typing import Final

from dashboards.grafana.promql import matchers

LABEL_SERVICE: Final = "sloth_service"
LABEL_SLO: Final = "sloth_slo"
LABEL_ID: Final = "sloth_id"

OBJECTIVE: Final = "slo:objective:ratio"
ERROR_BUDGET: Final = "slo:error_budget:ratio"
CURRENT_BURN_RATE: Final = "slo:current_burn_rate:ratio"
PERIOD_BURN_RATE: Final = "slo:period_burn_rate:ratio"
PERIOD_BUDGET_REMAINING: Final = "slo:period_error_budget_remaining:ratio"


def sli_error(window: str) -> str:
    """The error ratio of the SLI over `window` (`5m`, `1h`, ..., the period)."""
    return f"slo:sli_error:ratio_rate{window}"


def selector(service: str, slo: str | None = None) -> str:
    """`{sloth_service="svc", sloth_slo="name"}`; every SLO of the service without `slo`."""
    labels = {LABEL_SERVICE: service} | ({LABEL_SLO: slo} if slo else {})
    return matchers(**labels)


def series(name: str, service: str, slo: str | None = None) -> str:
    """One series per SLO of the recording rule `name`."""
    return f"max by ({LABEL_SLO}) ({name}{selector(service, slo)})"


def burn_rate(window: str, service: str, slo: str) -> str:
    """How fast the SLO burns its error budget over `window` (1 = exactly on budget)."""
    return f"{series(sli_error(window), service, slo)} / {series(ERROR_BUDGET, service, slo)}"
