"""Per-request verdicts: is this request a good or a bad event for each SLO?

Each SLI is defined once here, in Python (for the server, per request) and in SQL
(for budgets over the trace log), side by side so they cannot disagree:
- latency SLIs (ttft, tpot, e2e): events are successful requests that have the value;
  bad when the value exceeds the SLO's target for the request's context length;
- availability: every request but those the client abandoned; bad when the server
  failed or refused it (5xx, 429);
- error_rate: the same events; bad when the engine or server failed it (status error).
"""

from __future__ import annotations

from observe import registry as R
from observe.record import RequestRecord
from slo.spec import SLO, SLOSpec

LATENCY_COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}
CONTEXT_COLUMN = "prompt_tokens"


def verdict(slo: SLO, rec: RequestRecord) -> bool | None:
    """True (good), False (bad) or None (not an event for this SLO)."""
    if slo.sli in LATENCY_COLUMNS:
        value = getattr(rec, LATENCY_COLUMNS[slo.sli])
        if rec.status != R.STATUS_OK or value is None:
            return None
        return value <= slo.target(rec.prompt_tokens)
    if rec.status == R.STATUS_ABORTED:
        return None
    if slo.sli == "availability":
        return not (rec.http_status >= 500 or rec.http_status == 429)
    return rec.status != R.STATUS_ERROR


def event_sql(slo: SLO) -> str:
    """SQL over `requests`: true when the row is an event for `slo`."""
    if slo.sli in LATENCY_COLUMNS:
        return f"(status = 'ok' AND {LATENCY_COLUMNS[slo.sli]} IS NOT NULL)"
    return "(status <> 'aborted')"


def bad_sql(slo: SLO) -> str:
    """SQL over `requests`: true when the row is a bad event for `slo`."""
    if slo.sli in LATENCY_COLUMNS:
        column = LATENCY_COLUMNS[slo.sli]
        return f"({event_sql(slo)} AND {column} > {slo.target.sql(CONTEXT_COLUMN)})"
    if slo.sli == "availability":
        return "(status <> 'aborted' AND (http_status >= 500 OR http_status = 429))"
    return "(status = 'error')"


class Judge:
    """Judges finished requests against every SLO of a spec."""

    def __init__(self, spec: SLOSpec):
        self.spec = spec
        ttft = [s for s in spec.slos if s.sli == "ttft"]
        self._ttft = ttft[0] if ttft else None  # the one behind `slo_ttft_target_s`

    def ttft_target(self, prompt_tokens: int) -> float | None:
        """The TTFT target for a prompt of this length (None without a TTFT SLO)."""
        return None if self._ttft is None else self._ttft.target(prompt_tokens)

    def judge(self, rec: RequestRecord) -> list[tuple[str, bool]]:
        """(slo name, good) for each SLO the request is an event of; also fills the
        record's `slo_ttft_target_s` and `slo_ok` (every verdict good)."""
        if self._ttft is not None:
            rec.slo_ttft_target_s = self._ttft.target(rec.prompt_tokens)
        verdicts = [(slo.name, v) for slo in self.spec.slos if (v := verdict(slo, rec)) is not None]
        rec.slo_ok = all(good for _, good in verdicts) if verdicts else None
        return verdicts
