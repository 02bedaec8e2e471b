"""SLO status as JSON (the `/admin/slo` body) and as a terminal table.

`slo_status` is the one way from a trace log to that JSON: the admin API, the console
and `tailguard slo status --db` all call it. The table renders from the JSON form, so
`tailguard slo status --url` (JSON from a server) and `--db` (computed locally) print
the same thing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Final

from slo.budget import Status, compute_status
from slo.spec import SLOSpec

if TYPE_CHECKING:
    from observe.query import QueryResult

SHOWN_WINDOWS = ("5m", "1h", "6h", "1d", "3d")
STATUS_MAX_ROWS: Final = 100_000  # one row per SLO, group and window: far below this


def status_to_dict(status: Status) -> dict:
    return {"now": status.now.isoformat(), "goodput_rps": status.goodput_rps,
            "slos": [asdict(s) for s in status.slos]}


def slo_status(query: Callable[..., QueryResult], spec: SLOSpec) -> dict:
    """Every SLO of `spec` judged on the trace log that `query` reads, as JSON.

    `query(sql, max_rows=N)` returns an `observe.query.QueryResult`: the server's own
    `TraceLog.query`, or `observe.query.query_file` bound to a file no server holds.
    """
    def rows(sql: str) -> tuple[list[str], list[tuple]]:
        result = query(sql, max_rows=STATUS_MAX_ROWS)
        return result.columns, result.rows

    return status_to_dict(compute_status(rows, spec))


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def _rate(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _group_label(group: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in group.items()) or "all"


def format_status(data: dict, groups: bool = False) -> str:
    """One line per SLO (and per context bucket / priority with `groups`)."""
    header = (["slo", "group", "objective", "attainment", "budget left", "events"]
              + [f"burn {w}" for w in SHOWN_WINDOWS])
    lines = [header]
    for slo in data["slos"]:
        if slo["group"] and not groups:
            continue
        windows = {w["window"]: w for w in slo["windows"]}
        period = windows.get(slo["period"], {})
        lines.append([slo["name"], _group_label(slo["group"]), _pct(slo["objective"]),
                      _pct(slo["attainment"]), _pct(slo["budget_remaining"]),
                      str(period.get("events", 0))]
                     + [_rate(windows.get(w, {}).get("burn_rate")) for w in SHOWN_WINDOWS])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines]
    goodput = ", ".join(f"{w} {rps:.3f}/s" for w, rps in data["goodput_rps"].items()
                        if w in SHOWN_WINDOWS)
    return "\n".join(text + [f"goodput (requests meeting every SLO): {goodput}"]) + "\n"
