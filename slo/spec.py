"""SLO specs: an OpenSLO-shaped YAML file, checked field by field.

```yaml
service: tailguard
slos:
  - name: ttft                # [a-z][a-z0-9_]*, the `slo` label in metrics and rules
    sli: ttft                 # ttft | tpot | e2e | availability | error_rate
    objective: 0.99           # share of good events
    timeWindow: 30d           # rolling window the error budget is computed over
    budgetingMethod: Occurrences
    target: {kind: context, short_base_s: 0.2, long_base_s: 0.5, breakpoint_tokens: 1024}
```
Latency SLIs need a `target` (`context`, `fixed: {seconds}`, or `table: {steps:
[[max_tokens, seconds], ..., [null, seconds]]}`); the others must not have one. A bad
spec raises `SpecError` naming the field and its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from slo.targets import ContextTarget, FixedTarget, TableTarget, Target
from slo.yaml_positions import Located, load_located

LATENCY_SLIS = ("ttft", "tpot", "e2e")
EVENT_SLIS = ("availability", "error_rate")
SLIS = LATENCY_SLIS + EVENT_SLIS
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_DURATION = re.compile(r"^(\d+)(m|h|d|w)$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 604800}


class SpecError(ValueError):
    """An invalid SLO spec; the message names the field and the line."""


@dataclass(frozen=True, slots=True)
class SLO:
    name: str
    sli: str
    objective: float
    window_s: int
    target: Target | None = None
    description: str = ""

    @property
    def error_budget(self) -> float:
        return 1.0 - self.objective

    @property
    def window(self) -> str:
        return format_duration(self.window_s)


@dataclass(frozen=True, slots=True)
class SLOSpec:
    service: str
    slos: tuple[SLO, ...]

    def get(self, name: str) -> SLO:
        for slo in self.slos:
            if slo.name == name:
                return slo
        raise KeyError(name)


def parse_duration(text: str) -> int:
    match = _DURATION.match(str(text).strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 30d, 6h or 5m")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def format_duration(seconds: int) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNIT_S[unit] == 0 and seconds >= _UNIT_S[unit]:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    raise ValueError(f"{seconds}s is not a whole number of minutes")


def load_spec(path: str | Path | None = None) -> SLOSpec:
    """The spec in `path`, or the default one shipped with tailguard."""
    if path is None:
        text = resources.files("slo").joinpath("default_slo.yaml").read_text()
        return parse_spec(text, "default_slo.yaml")
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_spec(text, str(path))


def parse_spec(text: str, source: str = "<spec>") -> SLOSpec:
    try:
        return _parse_document(text, source)
    except SpecError:
        raise
    except yaml.YAMLError as exc:  # tags and unhashable keys surface while reading values
        raise SpecError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    except (TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        # a shape no check named: still one clear line, never a traceback
        raise SpecError(f"{source}: not a valid SLO spec ({type(exc).__name__}: {exc})"
                        ) from None


def _parse_document(text: str, source: str) -> SLOSpec:
    try:
        doc = load_located(text, source)
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: not valid YAML: {exc}") from None
    from slo.openslo import from_openslo, is_openslo

    if is_openslo(doc):
        return from_openslo(doc, source)
    root = doc.mapping("spec")
    service = root.get("service", "tailguard").string()
    slos = root.require("slos").sequence()
    parsed = tuple(_parse_slo(item) for item in slos.items())
    if not parsed:
        raise slos.error("must list at least one SLO")
    _check_unique([(s.name, item.mapping("SLO").require("name"))
                   for s, item in zip(parsed, slos.items())])
    return SLOSpec(service, parsed)


def _parse_slo(node: Located) -> SLO:
    m = node.mapping("SLO")
    m.only({"name", "sli", "objective", "timeWindow", "budgetingMethod", "target",
            "description"})
    name = m.require("name").string()
    if not _NAME.fullmatch(name):
        raise m.require("name").error("must match [a-z][a-z0-9_]*")
    sli = m.require("sli").choice(SLIS)
    budgeting = m.get("budgetingMethod", "Occurrences").string()
    if budgeting.lower() != "occurrences":
        raise m.require("budgetingMethod").error("only Occurrences budgeting is supported")
    return SLO(name=name, sli=sli, objective=_objective(m.require("objective")),
               window_s=m.get("timeWindow", "30d").convert(parse_duration),
               target=_target(m, sli), description=m.get("description", "").string())


def _objective(node: Located) -> float:
    value = node.number()
    if not 0 < value < 1:
        raise node.error("must be between 0 and 1 (e.g. 0.99)")
    return value


def _target(m, sli: str) -> Target | None:
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
    steps = tuple(_table_step(s) for s in spec.require("steps").sequence().items())
    return spec.convert(lambda _: TableTarget(steps))


def _table_step(node: Located) -> tuple[int | None, float]:
    pair = node.sequence().items()
    if len(pair) != 2:
        raise node.error("a step is [max_tokens or null, seconds]")
    bound = None if pair[0].value is None else int(pair[0].number())
    return bound, pair[1].number()


def _check_unique(names: list[tuple[str, Located]]) -> None:
    """(name, where it was given) pairs; the second use of a name is the error."""
    seen = set()
    for name, node in names:
        if name in seen:
            raise node.error(f"SLO name {name!r} is used twice")
        seen.add(name)
