"""Grafana dashboards generated from the metric registry and the SLO spec with
grafana-foundation-sdk's builders; `tailguard dashboards --out DIR` writes them.

The JSON files beside this module are the generated output for the default spec,
golden-tested by `tests/test_dashboards.py`.
"""

import warnings

with warnings.catch_warnings():
    # The SDK's classic dashboard module warns on import in favour of its v2 schema,
    # which Grafana still gates behind a feature flag; classic JSON imports anywhere.
    warnings.filterwarnings("ignore", "Prefer using dashboardv2", DeprecationWarning)
    from dashboards.grafana.generate import DASHBOARDS, build_all, render, write_all

__all__ = ["DASHBOARDS", "build_all", "render", "write_all"]
