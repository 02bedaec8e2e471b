"""Build every dashboard from the metric registry and an SLO spec, and write them
as sorted, indented JSON: the same inputs always give the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

from dashboards.grafana import engine, latency, policies, slo_overview
from slo.spec import SLOSpec

# File name -> builder; each builder takes the SLO spec and returns the JSON data.
DASHBOARDS = {
    "slo-overview.json": slo_overview.build,
    "latency.json": latency.build,
    "engine.json": engine.build,
    "policies.json": policies.build,
}


def build_all(spec: SLOSpec) -> dict[str, dict]:
    """File name -> dashboard JSON data, for every dashboard."""
    return {name: build(spec) for name, build in DASHBOARDS.items()}


def render(data: dict) -> str:
    """The file text of one dashboard."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_all(spec: SLOSpec, out_dir: str | Path) -> list[Path]:
    """Write every dashboard into `out_dir` (created if missing); the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in build_all(spec).items():
        path = out / name
        path.write_text(render(data), encoding="utf-8")
        paths.append(path)
    return paths
