"""Import of OpenSLO v1 `SLO` objects, where they map onto tailguard's SLIs.

An OpenSLO SLO maps when it uses Occurrences budgeting, one rolling time window, and
names its SLI, either as the indicator's name (`ttft`, `tpot`, `e2e`, `availability`,
`error_rate`) or with the annotation `tailguard/sli`. A latency objective's `value`
(with `op: lt` or `lte`) is its threshold in seconds. One SLO object, or a YAML list
of them, is accepted.
"""

from __future__ import annotations

import re

from slo import field_checks
from slo.durations import parse_duration
from slo.spec import EVENT_SLIS, NAME_PATTERN, SLIS, SLO, SLOSpec
from slo.targets import FixedTarget
from slo.yaml_positions import Located

API_PREFIX = "openslo/"


def is_openslo(doc: Located) -> bool:
    first = doc.sequence().items()[0] if doc.node is not None and doc.node.tag.endswith(
        ":seq") and doc.node.value else doc
    value = first.value
    return isinstance(value, dict) and str(value.get("apiVersion", "")).startswith(API_PREFIX)


def from_openslo(doc: Located, source: str):
    items = doc.sequence().items() if doc.node.tag.endswith(":seq") else [doc]
    parsed = [_one(item) for item in items]
    field_checks.check_unique([(slo.name, item.mapping("SLO").require("metadata"))
                   for (_, slo), item in zip(parsed, items)])
    return SLOSpec(parsed[0][0], tuple(slo for _, slo in parsed))


def _one(node: Located):
    m = node.mapping("OpenSLO object")
    if m.require("kind").string() != "SLO":
        raise m.require("kind").error("only kind: SLO can be imported")
    meta, spec = m.require("metadata").mapping("metadata"), m.require("spec").mapping("spec")
    name = re.sub(r"[^a-z0-9_]", "_", meta.require("name").string().lower())
    if not NAME_PATTERN.fullmatch(name):
        raise meta.require("name").error("must start with a letter (names become "
                                         "[a-z][a-z0-9_]*)")
    sli = _sli_name(meta, spec)
    if sli not in SLIS:
        raise meta.error("cannot map this SLO: name its SLI with the annotation "
                         f"tailguard/sli ({', '.join(SLIS)})")
    if spec.get("budgetingMethod", "Occurrences").string().lower() != "occurrences":
        raise spec.require("budgetingMethod").error("only Occurrences budgeting maps")
    windows = spec.require("timeWindow").sequence().items()
    window_s = windows[0].mapping("timeWindow").require("duration").convert(parse_duration)
    objective = spec.require("objectives").sequence().items()[0].mapping("objective")
    target = None
    if sli not in EVENT_SLIS:
        if objective.get("op", "lte").choice(("lt", "lte")) and not objective.get("value").present:
            raise objective.error(f"a {sli} objective needs a value (seconds)")
        target = objective.require("value").convert(lambda v: FixedTarget(float(v)))
    threshold = field_checks.objective(objective.require("target"))
    slo = SLO(name=name, sli=sli, objective=threshold,
              window_s=window_s, target=target,
              description=spec.get("description", "").value or "")
    return spec.get("service", "tailguard").string(), slo


def _sli_name(meta, spec) -> str | None:
    annotations = meta.get("annotations", {}).value or {}
    if "tailguard/sli" in annotations:
        return annotations["tailguard/sli"]
    indicator = spec.get("indicator")
    if indicator.present:
        return ((indicator.value or {}).get("metadata") or {}).get("name")
    return None
