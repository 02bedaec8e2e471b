"""The SLO recording rules the SLO panels read, under Sloth's names.

`tailguard rules` records every SLO of the spec the way Sloth (https://sloth.dev)
does, under the names and labels `observe.registry` defines (Sloth's own): one series
per SLO, labelled `sloth_service` (the spec's service), `sloth_slo` (the SLO's name)
and `sloth_id`. Series are read with `max by (sloth_slo)`, which keeps one series per
SLO and drops any extra label (Sloth adds `sloth_window` to the SLI rules) without
ever adding two series together.
"""

from __future__ import annotations

from dashboards.grafana.promql import matchers
from observe import registry as R


def selector(service: str, slo: str | None = None) -> str:
    """`{sloth_service="svc", sloth_slo="name"}`; every SLO of the service without `slo`."""
    labels = {R.LABEL_SLOTH_SERVICE: service} | ({R.LABEL_SLOTH_SLO: slo} if slo else {})
    return matchers(**labels)


def series(name: str, service: str, slo: str | None = None) -> str:
    """One series per SLO of the recording rule `name`."""
    return f"max by ({R.LABEL_SLOTH_SLO}) ({name}{selector(service, slo)})"


def burn_rate(window: str, service: str, slo: str) -> str:
    """How fast the SLO burns its error budget over `window` (1 = exactly on budget)."""
    sli = series(R.RECORD_SLI_ERROR.format(window), service, slo)
    return f"{sli} / {series(R.RECORD_ERROR_BUDGET, service, slo)}"
