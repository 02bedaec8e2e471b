"""Tenants: who was protected and who paid, per client (the API key's name).

Each finished request has one outcome for its client, defined once here, in Python (the
server's live `tailguard_client_requests_total`) and as SQL (the per-client numbers over
the trace log that the console and `tailguard slo status --tenants` show), side by side
so they cannot disagree:
- `good` / `late`: served (status ok), and within every SLO or not, by the verdict the
  server gave it (`slo_ok`; a request no SLO judged is good);
- `shed`: refused by a policy or by admission (a `shed:`/`reject:` policy action, or the
  limiter's `admission_timeout`): the server chose not to serve it;
- otherwise its status: `rejected` (refused for what it asked or who asked: a 4xx, an
  unknown key, its client's quota), `error`, `aborted`.
Attainment is good / served; goodput is good requests per second of the window.

The client comes from the keys file (`anonymous` on a server without one), never from a
peer address: a bounded set with no personal data. A request whose client is not known
(no valid key) counts as `unknown`, and so does any name outside the label set given.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass
from typing import Final

from observe import registry as R
from observe.record import RequestRecord

Query = Callable[[str], tuple[list[str], list[tuple]]]  # sql -> (columns, rows)

OUTCOME_GOOD: Final = "good"
OUTCOME_LATE: Final = "late"
OUTCOME_SHED: Final = "shed"
OUTCOMES: Final = (OUTCOME_GOOD, OUTCOME_LATE, OUTCOME_SHED, R.STATUS_REJECTED,
                   R.STATUS_ERROR, R.STATUS_ABORTED)
CLIENT_UNKNOWN: Final = "unknown"
# policy actions that refused the request (`refuse:deadline`: the deadline check)
SHED_PREFIXES: Final = ("shed:", "reject:", "refuse:")
SHED_ERROR: Final = "admission_timeout"  # the limiter gave up waiting for a slot
DEFAULT_WINDOW_S: Final = 3600

SHED_SQL: Final = (
    "(coalesce(len(list_filter(policy_actions, lambda a: "
    + " OR ".join(f"a LIKE '{p}%'" for p in SHED_PREFIXES)
    + f")), 0) > 0 OR coalesce(error_type, '') = '{SHED_ERROR}')")
OUTCOME_SQL: Final = (
    f"CASE WHEN status = '{R.STATUS_OK}' THEN CASE WHEN slo_ok IS NOT DISTINCT FROM false "
    f"THEN '{OUTCOME_LATE}' ELSE '{OUTCOME_GOOD}' END "
    f"WHEN status = '{R.STATUS_REJECTED}' AND {SHED_SQL} THEN '{OUTCOME_SHED}' "
    "ELSE status END")
_HAS_CLIENT_SQL = ("SELECT count(*) FROM information_schema.columns "
                   "WHERE table_name = 'requests' AND column_name = 'client'")


def is_shed(actions: Iterable[str], error_type: str | None) -> bool:
    return any(a.startswith(SHED_PREFIXES) for a in actions) or error_type == SHED_ERROR


def outcome(rec: RequestRecord) -> str:
    """One of OUTCOMES for a finished (and judged) request; as `OUTCOME_SQL`."""
    if rec.status == R.STATUS_OK:
        return OUTCOME_LATE if rec.slo_ok is False else OUTCOME_GOOD
    if rec.status == R.STATUS_REJECTED and is_shed(rec.policy_actions, rec.error_type):
        return OUTCOME_SHED
    return rec.status


def tenant_label(client: str | None, known: Collection[str]) -> str:
    """The `client` label value: a name of the label set, else CLIENT_UNKNOWN."""
    return client if client is not None and client in known else CLIENT_UNKNOWN


@dataclass(frozen=True, slots=True)
class Tenant:
    """One client's requests over a window, by outcome."""

    client: str
    requests: int
    good: int
    late: int
    shed: int
    rejected: int
    error: int
    aborted: int
    attainment: float | None  # good / served; None: nothing served
    goodput_rps: float  # good requests per second of the window

    def as_dict(self) -> dict:
        return asdict(self)


def tenants_sql(window_s: int, has_client: bool = True) -> str:
    """Requests per (client, outcome) over the last `window_s` seconds, and how far back
    the window's oldest request is. A log from before the `client` column: all unknown."""
    client = "client" if has_client else "NULL"
    return (f"SELECT coalesce({client}, '{CLIENT_UNKNOWN}') AS client, {OUTCOME_SQL} "
            "AS outcome, count(*) AS requests, max(epoch(now()) - epoch(arrival_ts)) AS span_s "
            f"FROM requests WHERE arrival_ts > now() - INTERVAL {int(window_s)} SECOND "
            "AND arrival_ts <= now() GROUP BY ALL ORDER BY client, outcome")


def tenant_status(query: Query, window_s: int = DEFAULT_WINDOW_S) -> list[Tenant]:
    """Every client seen in the last `window_s` seconds, busiest first. Goodput divides by
    the window, or by how far back the log goes when it is younger (as `slo.budget`'s)."""
    _, found = query(_HAS_CLIENT_SQL)
    columns, rows = query(tenants_sql(window_s, has_client=bool(found and found[0][0])))
    records = [dict(zip(columns, row)) for row in rows]
    span = min(window_s, max(max((r["span_s"] or 0.0 for r in records), default=0.0), 1.0))
    counts: dict[str, dict[str, int]] = {}
    for r in records:
        counts.setdefault(r["client"], dict.fromkeys(OUTCOMES, 0))[r["outcome"]] = \
            int(r["requests"])
    tenants = [_tenant(client, by, span) for client, by in counts.items()]
    return sorted(tenants, key=lambda t: (-t.requests, t.client))


def _tenant(client: str, by: dict[str, int], span_s: float) -> Tenant:
    good, late = by[OUTCOME_GOOD], by[OUTCOME_LATE]
    return Tenant(client, sum(by.values()), good, late, by[OUTCOME_SHED],
                  by[R.STATUS_REJECTED], by[R.STATUS_ERROR], by[R.STATUS_ABORTED],
                  good / (good + late) if good + late else None, good / span_s)


def format_tenants(tenants: list[dict], window_s: int = DEFAULT_WINDOW_S) -> str:
    """A terminal table of `Tenant.as_dict()` rows."""
    header = ["client", "requests", "good", "late", "shed", "rejected", "error", "aborted",
              "attainment", "goodput"]
    lines = [header] + [
        [t["client"]] + [str(t[k]) for k in header[1:8]]
        + ["-" if t["attainment"] is None else f"{100 * t['attainment']:.2f}%",
           f"{t['goodput_rps']:.3f}/s"] for t in tenants]
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    return f"tenants (last {window_s:g} s):\n" + "\n".join(text) + "\n"
