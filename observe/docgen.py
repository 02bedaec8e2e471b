"""Renders the registry as the metric and span tables of docs/observation.md.

`python -m observe.docgen docs/observation.md` rewrites the text between the
markers; `tests/test_docs.py` fails when the committed doc differs from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from observe import registry as R

BEGIN = "<!-- BEGIN GENERATED: registry (python -m observe.docgen); DO NOT EDIT -->"
END = "<!-- END GENERATED: registry -->"


def _bounds(metric: R.MetricDef) -> str:
    if not metric.buckets:
        return ""
    b = metric.buckets
    return f"{len(b)} bounds, {b[0]:g} .. {b[-1]:g}"


def metrics_table() -> str:
    lines = ["| metric | type | labels | unit | buckets | meaning |", "|---|---|---|---|---|---|"]
    for m in R.ALL_METRICS:
        labels = ", ".join(m.labels) or "-"
        lines.append(f"| `{m.prom_name}` | {m.kind} | {labels} | {m.unit or '-'} | "
                     f"{_bounds(m)} | {m.description} |")
    return "\n".join(lines)


def spans_list() -> str:
    return "Span names: " + ", ".join(f"`{s}`" for s in R.ALL_SPANS) + "."


def render() -> str:
    return "\n".join([BEGIN, metrics_table(), "", spans_list(), END])


def rewrite(path: Path) -> str:
    text = path.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + render() + tail


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/observation.md")
    target.write_text(rewrite(target))
