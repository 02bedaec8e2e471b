"""SLO overview: for every SLO of the spec, its objective, attainment over the
period, error budget left and burn rates over the alerting windows.

The numbers come from the SLO recording rules (Sloth's names, see `sloth.py`); the
per-context-bucket view of bad events reads `tailguard_slo_requests_total` itself.
"""

from __future__ import annotations

from dashboards.grafana import sloth
from dashboards.grafana.layout import Board
from dashboards.grafana.panels import graph, legend_of, queries, single, steps
from dashboards.grafana.promql import matchers, rate
from observe import registry as R
from slo.spec import SLO, SLOSpec
from slo.tenants import OUTCOME_GOOD, OUTCOME_LATE, OUTCOME_SHED
from slo.windows import BURN_WINDOWS

# The windows a burn rate is drawn over: the short page window, then every long one.
BURN_RATE_WINDOWS = ("5m",) + tuple(w.long for w in BURN_WINDOWS)
PERCENT_DECIMALS = 2  # 99.95% must not round to 100%


def build(spec: SLOSpec) -> dict:
    board = Board(f"{spec.service} SLO overview",
                  "Objective, attainment, error budget and burn rates of every SLO in "
                  "the spec, read from the SLO recording rules.")
    _all_slos(board, spec.service)
    _clients(board)
    for slo in spec.slos:
        _one_slo(board, spec.service, slo)
    return board.to_json()


def _clients(board: Board) -> None:
    """Who was protected and who paid: per client (API key name) goodput, attainment of
    what was served, and requests shed (slo/tenants.py defines the outcomes)."""
    by, legend = (R.LABEL_CLIENT,), legend_of(R.LABEL_CLIENT)

    def of(*outcomes: str) -> str:
        match = outcomes[0] if len(outcomes) == 1 else "~" + "|".join(outcomes)
        return rate(R.CLIENT_REQUESTS, by, matchers(**{R.LABEL_OUTCOME: match}))

    board.row("Clients")
    board.add(graph("Goodput per client", "Requests per second served within every SLO, "
                    "per client.", "reqps", queries((of(OUTCOME_GOOD), legend))), width=8)
    board.add(graph("Attainment per client", "Share of each client's served requests that "
                    "met every SLO.", "percentunit",
                    queries((f"{of(OUTCOME_GOOD)} / {of(OUTCOME_GOOD, OUTCOME_LATE)}", legend)),
                    steps((0, "red"), (0.99, "green"))).decimals(PERCENT_DECIMALS), width=8)
    board.add(graph("Shed per client", "Requests per second refused by a policy or by "
                    "admission, per client: who paid for the protection.", "reqps",
                    queries((of(OUTCOME_SHED), legend))), width=8)


def _all_slos(board: Board, service: str) -> None:
    board.row("All SLOs")
    board.add(graph("Error budget remaining", "Share of each SLO's error budget left "
                    "over its period (below 0: overspent).", "percentunit",
                    queries((sloth.series(R.RECORD_PERIOD_BUDGET_REMAINING, service),
                             legend_of(R.LABEL_SLOTH_SLO))), steps((0, "red"), (0.25, "green"))))
    board.add(graph("Burn rate now", "Each SLO's error-budget burn rate over the last "
                    "5 minutes; 1 spends the budget exactly over the period.", "none",
                    queries((sloth.series(R.RECORD_CURRENT_BURN_RATE, service),
                             legend_of(R.LABEL_SLOTH_SLO))), _burn_steps()))


def _one_slo(board: Board, service: str, slo: SLO) -> None:
    board.row(f"SLO {slo.name}: {slo.objective * 100:g}% of {slo.sli} events good over "
              f"{slo.window}")
    for panel in _stats(service, slo):
        board.add(panel, width=4, height=6)
    board.add(_burn_rates(service, slo), width=8, height=6)
    board.add(graph("Error budget remaining", f"Share of the {slo.window} error budget "
                    "left.", "percentunit", queries((sloth.series(
                        R.RECORD_PERIOD_BUDGET_REMAINING, service, slo.name), slo.name)),
                    steps((0, "red"), (0.25, "green"))))
    board.add(_bad_by_bucket(slo))


def _stats(service: str, slo: SLO) -> list:
    def one(name: str, legend: str) -> list:
        return queries((sloth.series(name, service, slo.name), legend))

    period_sli = R.RECORD_SLI_ERROR.format(slo.window)
    attainment = f"1 - {sloth.series(period_sli, service, slo.name)}"
    meeting = steps((0, "red"), (slo.objective, "green"))
    return [
        single("Objective", slo.description or f"The {slo.sli} objective.",
               "percentunit", one(R.RECORD_OBJECTIVE, "objective"),
               steps((0, "blue"))).decimals(PERCENT_DECIMALS),
        single(f"Attainment ({slo.window})", "Share of good events over the period.",
               "percentunit", queries((attainment, "attainment")),
               meeting).decimals(PERCENT_DECIMALS),
        single("Error budget left", f"Share of the {slo.window} error budget left.",
               "percentunit", one(R.RECORD_PERIOD_BUDGET_REMAINING, "remaining"),
               steps((0, "red"), (0.25, "orange"), (0.5, "green"))).decimals(1),
        single("Burn rate now", "Error-budget burn rate over the last 5 minutes.",
               "none", one(R.RECORD_CURRENT_BURN_RATE, "burn rate"), _burn_steps(slo.window_s)),
    ]


def _burn_rates(service: str, slo: SLO):
    pairs = [(sloth.burn_rate(w, service, slo.name), w) for w in BURN_RATE_WINDOWS]
    return graph("Burn rate by window", "Error-budget burn rate over each alerting "
                 "window (multi-window, multi-burn-rate alerts compare these).", "none",
                 queries(*pairs), _burn_steps(slo.window_s))


def _bad_by_bucket(slo: SLO):
    by = (R.LABEL_CONTEXT_BUCKET,)
    this_slo = {R.LABEL_SLO: slo.name}
    bad = rate(R.SLO_REQUESTS, by, matchers(**this_slo, **{R.LABEL_RESULT: R.RESULT_BAD}))
    events = rate(R.SLO_REQUESTS, by, matchers(**this_slo))
    return graph("Bad events by context bucket", "Share of this SLO's events judged bad "
                 "against the context-aware target, per context bucket; the line is the "
                 "error budget.", "percentunit", queries((f"{bad} / {events}",
                                                         legend_of(R.LABEL_CONTEXT_BUCKET))),
                 steps((0, "green"), (round(slo.error_budget, 6), "red")))


def _burn_steps(period_s: int | None = None):
    """Orange from 1 (on budget); red from the fastest page factor (14.4 for 30 days)."""
    fastest = [(max(w.factor(period_s) for w in BURN_WINDOWS), "red")] if period_s else []
    return steps((0, "green"), (1, "orange"), *fastest)
