"""Reading an SLO spec: tailguard's own OpenSLO-shaped YAML, checked field by field, or
OpenSLO v1 `SLO` objects (`slo.openslo`).

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

from importlib import resources
from pathlib import Path

import yaml

from slo import field_checks
from slo.durations import parse_duration
from slo.openslo import from_openslo, is_openslo
from slo.spec import NAME_PATTERN, SLIS, SLO, SLOSpec, SpecError
from slo.yaml_positions import Located, load_located


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
    if is_openslo(doc):
        return from_openslo(doc, source)
    root = doc.mapping("spec")
    service = root.get("service", "tailguard").string()
    slos = root.require("slos").sequence()
    parsed = tuple(_parse_slo(item) for item in slos.items())
    if not parsed:
        raise slos.error("must list at least one SLO")
    field_checks.check_unique([(s.name, item.mapping("SLO").require("name"))
                   for s, item in zip(parsed, slos.items())])
    return SLOSpec(service, parsed)


def _parse_slo(node: Located) -> SLO:
    m = node.mapping("SLO")
    m.only({"name", "sli", "objective", "timeWindow", "budgetingMethod", "target",
            "description"})
    name = m.require("name").string()
    if not NAME_PATTERN.fullmatch(name):
        raise m.require("name").error("must match [a-z][a-z0-9_]*")
    sli = m.require("sli").choice(SLIS)
    budgeting = m.get("budgetingMethod", "Occurrences").string()
    if budgeting.lower() != "occurrences":
        raise m.require("budgetingMethod").error("only Occurrences budgeting is supported")
    return SLO(name=name, sli=sli, objective=field_checks.objective(m.require("objective")),
               window_s=m.get("timeWindow", "30d").convert(parse_duration),
               target=field_checks.target(m, sli),
               description=m.get("description", "").string())
