"""Prometheus rules generated from SLO specs: maths pinned to known values, promtool
checks and unit tests, the committed files, runbooks and the `rules` command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from alerts import ops_tests
from alerts.config import RuleConfig
from alerts.ops_rules import OPS_ALERTS
from alerts.promtool import counter_values, promtool
from alerts.rules import (
    GENERATED_MARK,
    RULES_FILE,
    TESTS_FILE,
    render_rules,
    render_tests,
    rule_groups,
    write,
)
from alerts.slo_windows import scenarios
from observe import registry as R
from slo.loading import load_spec, parse_spec
from slo.windows import BURN_WINDOWS

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "alerts" / "generated"
DAY = 86400
SPEC_28D = """
service: shop
slos:
  - {name: checkout, sli: e2e, objective: 0.999, timeWindow: 28d, target: {kind: fixed, seconds: 1}}
"""


def _alerts(groups: dict) -> list[dict]:
    return [r for g in groups["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("period_days,window,factor", [
    (30, 0, 14.4), (30, 1, 6), (30, 2, 3), (30, 3, 1),
    (28, 0, 13.44), (28, 1, 5.6), (28, 2, 2.8), (28, 3, 0.933333),
], ids=[
    "a 30d period pages at 14.4x over 1h", "a 30d period pages at 6x over 6h",
    "a 30d period tickets at 3x over 1d", "a 30d period tickets at 1x over 3d",
    "a 28d period pages at 13.44x over 1h", "a 28d period pages at 5.6x over 6h",
    "a 28d period tickets at 2.8x over 1d", "a 28d period tickets at 0.93x over 3d",
])
def test_burn_factor(period_days, window, factor):
    assert BURN_WINDOWS[window].factor(period_days * DAY) == factor


@pytest.mark.parametrize("spec,expected", [
    (load_spec(), ["(14.4 * 0.01)", "(6 * 0.01)", "(3 * 0.01)", "(1 * 0.01)",
                   "(14.4 * 0.0005)"]),
    (parse_spec(SPEC_28D), ["(13.44 * 0.001)", "(5.6 * 0.001)", "(2.8 * 0.001)",
                            "(0.933333 * 0.001)"]),
], ids=["the default spec's thresholds are factor x budget",
        "a 28d spec's thresholds come from its own period"])
def test_alert_thresholds(spec, expected):
    exprs = "".join(a["expr"] for a in _alerts(rule_groups(spec)))
    for threshold in expected:
        assert threshold in exprs


@pytest.mark.parametrize("spec,windows", [
    (load_spec(), ["5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"]),
    (parse_spec(SPEC_28D), ["5m", "30m", "1h", "2h", "6h", "1d", "3d", "4w"]),
], ids=["a 30d SLO records its SLI over 8 windows", "a 28d SLO records its period as 4w"])
def test_sli_windows(spec, windows):
    slo = spec.slos[0]
    groups = {g["name"]: g for g in rule_groups(spec)["groups"]}
    sli = groups[f"sloth-slo-sli-recordings-{spec.service}-{slo.name}"]["rules"]
    assert [r["record"] for r in sli] == [f"slo:sli_error:ratio_rate{w}" for w in windows]
    assert {r["labels"]["sloth_id"] for r in sli} == {f"{spec.service}-{slo.name}"}
    bucket = groups[f"tailguard-slo-sli-by-context-bucket-{spec.service}-{slo.name}"]["rules"]
    assert all("by (context_bucket)" in r["expr"] for r in bucket[:-1])


def test_every_slo_has_sloths_metadata_records():
    spec = load_spec()
    records = [r["record"] for g in rule_groups(spec)["groups"] for r in g["rules"]
               if "record" in r and "meta" in g["name"]]
    names = ["slo:objective:ratio", "slo:error_budget:ratio", "slo:time_period:days",
             "slo:current_burn_rate:ratio", "slo:period_burn_rate:ratio",
             "slo:period_error_budget_remaining:ratio", "sloth_slo_info"]
    assert records == names * len(spec.slos)


def test_every_alert_has_summary_description_and_a_runbook_section():
    doc = (ROOT / "docs" / "alerts.md").read_text()
    headings = {h.lower() for h in re.findall(r"^## (\S+)$", doc, re.M)}
    alerts = _alerts(rule_groups(load_spec()))
    assert len(alerts) == 2 * len(load_spec().slos) + len(OPS_ALERTS)
    for alert in alerts:
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], alert["alert"]
        assert notes["runbook_url"] == f"docs/alerts.md#{alert['alert'].lower()}"
        assert alert["alert"].lower() in headings, f"no runbook section for {alert['alert']}"
        assert alert["labels"]["severity"] in ("page", "ticket")


def test_operational_rules_use_registry_names_and_statuses():
    text = render_rules(load_spec())
    for metric in (R.E2E, R.REQUESTS, R.KV_CACHE_USAGE, R.MEMORY_FORECAST, R.RUNNING, R.WAITING,
                   R.SLO_REQUESTS):
        assert metric.prom_name in text
    assert f'{R.LABEL_STATUS}="{R.STATUS_ERROR}"' in text


def test_every_operational_alert_has_a_firing_and_a_silent_case():
    assert ops_tests.covered() == {a.name for a in OPS_ALERTS}


def test_the_default_spec_gets_every_alert_scenario():
    import yaml

    assert all(len(scenarios(slo)) == 8 for slo in load_spec().slos)
    names = [t["name"] for t in yaml.safe_load(render_tests(load_spec()))["tests"]]
    assert sum(": a " in n for n in names) == 8 * 2  # objectives 0.99 and 0.9995


def test_the_burn_window_table_in_the_docs_matches_slo_windows():
    doc = (ROOT / "docs" / "alerts.md").read_text()
    rows = re.findall(r"^\| (page|ticket) \| (\w+) \| (\w+) \| (\d+)% \| ([\d.]+) \| ([\d.]+) \|$",
                      doc, re.M)
    assert [(w.severity, w.long, w.short, round(w.budget_share * 100),
             w.factor(30 * DAY), round(w.factor(28 * DAY), 4)) for w in BURN_WINDOWS] == [
        (s, lg, sh, int(p), float(f30), float(f28)) for s, lg, sh, p, f30, f28 in rows]


@pytest.mark.parametrize("increments,notation", [
    ([1, 1, 1], "0+1x3"),
    ([2, 2, 0, 0], "0+2x2 4+0x1"),
    ([0.5], "0+0.5x1"),
], ids=["a steady counter is one run", "a counter that stops is two runs",
        "fractional steps are kept"])
def test_counter_notation(increments, notation):
    assert counter_values(increments) == notation


def test_generated_files_are_marked_and_match_a_fresh_render(tmp_path):
    write(load_spec(), tmp_path)
    for name in (RULES_FILE, TESTS_FILE):
        committed = (GENERATED / name).read_text()
        assert committed.startswith(GENERATED_MARK + "\n")
        assert committed == (tmp_path / name).read_text(), (
            f"alerts/generated/{name} is stale: run tailguard rules --out alerts/generated")


def test_promtool_checks_the_generated_rules():
    out = promtool("check", "rules", GENERATED / RULES_FILE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_of_the_generated_rules_pass():
    out = promtool("test", "rules", GENERATED / TESTS_FILE, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def test_rules_for_a_28d_spec_pass_their_own_promtool_tests(tmp_path):
    rules, tests = write(parse_spec(SPEC_28D), tmp_path, RuleConfig(job="shop-llm"))
    assert promtool("check", "rules", rules).returncode == 0
    out = promtool("test", "rules", tests, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


# --- the command ------------------------------------------------------------------
def tailguard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailguard", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_the_command_writes_rules_and_tests(tmp_path):
    out = tailguard("rules", "--slo", str(ROOT / "tests/data/slo_breach.yaml"),
                    "--out", str(tmp_path / "rules"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(tmp_path / "rules" / RULES_FILE),
                                       str(tmp_path / "rules" / TESTS_FILE)]
    assert 'sloth_slo="ttft_breach"' in (tmp_path / "rules" / RULES_FILE).read_text()


@pytest.mark.parametrize("args,needle", [
    (["--slo", "tests/data/no-such-spec.yaml"], "cannot read"),
    (["--slo", "{bad}"], "objective"),
    (["--job", 'a"b'], "job"),
    (["--runbook-base", "has space"], "runbook_base"),
    ([], None),
], ids=["a missing spec file is one line", "an invalid spec names the field",
        "a job name with quotes is refused", "a runbook base with spaces is refused",
        "a missing --out is refused"])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, needle):
    if "{bad}" in args:
        bad = tmp_path / "bad.yaml"
        bad.write_text("slos:\n  - {name: x, sli: ttft, objective: 1.5,"
                       " target: {kind: fixed, seconds: 1}}\n")
        args = [str(bad) if a == "{bad}" else a for a in args]
    out_args = [] if not args else ["--out", str(tmp_path / "out")]
    out = tailguard("rules", *args, *out_args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert needle is None or needle in out.stderr
