"""Checks of one SLO's fields, shared by both spec formats (tailguard's own and OpenSLO):
each takes a YAML node that knows its line, so an error can name it."""

from __future__ import annotations

from slo.spec import EVENT_SLIS, Target
from slo.targets import ContextTarget, FixedTarget, TableTarget
from slo.yaml_positions import Located


def objective(node: Located) -> float:
    value = node.number()
    if not 0 < value < 1:
        raise node.error("must be between 0 and 1 (e.g. 0.99)")
    return value


def target(m, sli: str) -> Target | None:
    node = m.get("target")
    if sli in EVENT_SLIS:
        if node.present:
            raise node.error(f"an {sli} SLO has no latency target")
        return None
    if not node.present:
        raise m.error(f"a {sli} SLO needs a target")
    spec = node.mapping("target")
    kind = spec.require("kind").choice(("context", "fixed", "table"))
    if kind == "context":
        spec.only({"kind", "short_base_s", "long_base_s", "breakpoint_tokens"})
        fields = {k: spec.get(k).number() for k in ("short_base_s", "long_base_s",
                                                    "breakpoint_tokens") if spec.get(k).present}
        return spec.convert(lambda _: ContextTarget(**fields))
    if kind == "fixed":
        spec.only({"kind", "seconds"})
        return spec.convert(lambda _: FixedTarget(spec.require("seconds").number()))
    spec.only({"kind", "steps"})
    steps = tuple(table_step(s) for s in spec.require("steps").sequence().items())
    return spec.convert(lambda _: TableTarget(steps))


def table_step(node: Located) -> tuple[int | None, float]:
    pair = node.sequence().items()
    if len(pair) != 2:
        raise node.error("a step is [max_tokens or null, seconds]")
    bound = None if pair[0].value is None else int(pair[0].number())
    return bound, pair[1].number()


def check_unique(names: list[tuple[str, Located]]) -> None:
    """(name, where it was given) pairs; the second use of a name is the error."""
    seen = set()
    for name, node in names:
        if name in seen:
            raise node.error(f"SLO name {name!r} is used twice")
        seen.add(name)
