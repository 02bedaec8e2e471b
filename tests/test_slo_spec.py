"""SLO specs: the default, bad specs named by field and line, OpenSLO import."""

from __future__ import annotations

import pytest

from slo.loading import load_spec, parse_spec
from slo.spec import SpecError
from slo.targets import ContextTarget, FixedTarget, TableTarget


def test_the_default_spec_has_every_sli_the_spec_asks_for():
    spec = load_spec()
    by_name = {s.name: s for s in spec.slos}
    assert {s.sli for s in spec.slos} == {"ttft", "tpot", "e2e", "availability", "error_rate"}
    assert by_name["availability"].objective == 0.9995
    assert by_name["error_rate"].objective == 0.99
    assert by_name["ttft"].target == ContextTarget(0.2, 0.5, 1024)
    assert by_name["first_token_health"].target == TableTarget(((4096, 0.3), (None, 0.8)))
    assert by_name["first_token_health"].target(4096) == 0.3
    assert by_name["first_token_health"].target(32768) == 0.8
    assert all(s.window_s == 30 * 86400 for s in spec.slos)


GOOD = """
slos:
  - name: fast
    sli: e2e
    objective: 0.95
    timeWindow: 7d
    target: {kind: fixed, seconds: 1.5}
"""


def test_a_minimal_spec_parses():
    (slo,) = parse_spec(GOOD).slos
    assert (slo.name, slo.sli, slo.objective, slo.window, slo.target) == \
        ("fast", "e2e", 0.95, "1w", FixedTarget(1.5))


BAD = [
    ("an objective of 1.5", GOOD.replace("0.95", "1.5"), 5, "slos[0].objective"),
    ("an unknown sli", GOOD.replace("sli: e2e", "sli: speed"), 4, "slos[0].sli"),
    ("a bad window", GOOD.replace("7d", "a week"), 6, "slos[0].timeWindow"),
    ("a missing target", GOOD.replace("    target: {kind: fixed, seconds: 1.5}\n", ""), 3,
     "slos[0]"),
    ("a negative threshold", GOOD.replace("1.5", "-1"), 7, "slos[0].target"),
    ("an unknown field", GOOD.replace("    sli: e2e", "    colour: red\n    sli: e2e"), 4,
     "slos[0].colour"),
    ("budgeting by time slices", GOOD.replace("    sli:", "    budgetingMethod: Timeslices\n    sli:"),
     4, "slos[0].budgetingMethod"),
    ("a duplicate name", GOOD + GOOD.split("slos:\n")[1], 8, "slos[1].name"),
    ("a non-monotone table", GOOD.replace("{kind: fixed, seconds: 1.5}",
                                          "{kind: table, steps: [[100, 0.5], [null, 0.2]]}"),
     7, "slos[0].target"),
    ("a target on availability", GOOD.replace("sli: e2e", "sli: availability"), 7,
     "slos[0].target"),
]


@pytest.mark.parametrize("case,text,line,field", BAD, ids=[b[0] for b in BAD])
def test_a_bad_spec_names_the_field_and_line(case, text, line, field):
    with pytest.raises(SpecError) as err:
        parse_spec(text, "my.yaml")
    assert str(err.value).startswith(f"my.yaml:{line}: {field}:"), str(err.value)


def test_an_unreadable_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


OPENSLO = """
- apiVersion: openslo/v1
  kind: SLO
  metadata:
    name: chat-ttft
    annotations: {tailguard/sli: ttft}
  spec:
    service: chat
    budgetingMethod: Occurrences
    timeWindow: [{duration: 28d, isRolling: true}]
    objectives: [{displayName: fast first token, op: lte, value: 0.4, target: 0.98}]
- apiVersion: openslo/v1
  kind: SLO
  metadata: {name: availability}
  spec:
    service: chat
    indicator: {metadata: {name: availability}}
    budgetingMethod: Occurrences
    timeWindow: [{duration: 30d, isRolling: true}]
    objectives: [{target: 0.999}]
"""


def test_openslo_objects_are_imported_where_they_map():
    spec = parse_spec(OPENSLO)
    assert spec.service == "chat"
    ttft, avail = spec.slos
    assert (ttft.name, ttft.sli, ttft.objective, ttft.window, ttft.target) == \
        ("chat_ttft", "ttft", 0.98, "4w", FixedTarget(0.4))
    assert (avail.sli, avail.objective, avail.target) == ("availability", 0.999, None)


def test_an_openslo_object_without_a_known_sli_is_refused():
    text = OPENSLO.split("- apiVersion")[1].replace("annotations: {tailguard/sli: ttft}", "")
    with pytest.raises(SpecError, match="tailguard/sli"):
        parse_spec("apiVersion" + text.replace("\n  ", "\n"))
