"""Degradation policies: which policy is active when, the memory forecast against the
measured KV-cache usage and the memory-pressure line, and the KV cache's time to full."""

from __future__ import annotations

from dashboards.grafana.layout import Board
from dashboards.grafana.panels import graph, legend_of, queries, single, states, steps
from dashboards.grafana.promql import gauge
from observe import registry as R

POLICY = (R.LABEL_POLICY,)


def build(_spec=None) -> dict:
    board = Board("tailguard degradation policies",
                  "Degradation policies over time and the KV-cache memory forecast that "
                  "can trigger them.")
    board.row("Policies")
    active = gauge(R.POLICY_ACTIVE, POLICY)
    board.add(single("Policies active now", "Policies active on at least one instance.",
                     "short", queries((f"count({active} > 0) or vector(0)", "active")),
                     steps((0, "green"), (1, "orange"))), width=6)
    board.add(states("Active policies", f"{R.POLICY_ACTIVE.description} Each lane counts "
                     "the instances where the policy is active.",
                     queries((active, legend_of(R.LABEL_POLICY))),
                     steps((0, "green"), (1, "red"))), width=18)
    board.row("Memory")
    board.add(_forecast(), width=16, height=9)
    board.add(_time_to_full(), width=8, height=9)
    return board.to_json()


def _forecast():
    pairs = [(gauge(R.MEMORY_FORECAST, (R.LABEL_HORIZON, "instance")),
              f"forecast {legend_of(R.LABEL_HORIZON)} {legend_of('instance')}"),
             (gauge(R.KV_CACHE_USAGE, ("instance",)), "measured {{instance}}")]
    return graph("Memory forecast vs measured KV-cache usage",
                 f"{R.MEMORY_FORECAST.description} The line is the memory-pressure "
                 "threshold of the degradation policy.", "percentunit", queries(*pairs),
                 steps((0, "green"), (R.MEMORY_PRESSURE_RATIO, "red"))).min(0).max(1)


def _time_to_full():
    seconds = gauge(R.KV_CACHE_EXHAUSTION, ("instance",))
    return graph("KV cache: time to full at its trend",
                 f"{R.KV_CACHE_EXHAUSTION.description} Below the line the alert "
                 "TailguardKVCacheFullSoon fires; the memory-pressure policy acts below "
                 "60 s.", "s", queries((seconds, legend_of("instance"))),
                 steps((0, "red"), (R.KV_FULL_SOON_S, "green"))).min(0)

