"""Grafana dashboards: golden files, Grafana's official dashboard schema, the SDK's own
models, every registry metric on a panel, and the `tailguard dashboards` command."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from dashboards.grafana import DASHBOARDS, build_all, render
from dashboards.grafana.layout import GENERATED, uid_for
from dashboards.grafana.promql import QUANTILES
from dashboards.grafana.slo_overview import BURN_RATE_WINDOWS
from observe import registry as R
from slo.loading import load_spec, parse_spec
from slo.windows import BURN_WINDOWS
from tailguard.cli import Group
from tailguard.cmd_dashboards import dashboards as dashboards_command

GRAFANA_DIR = Path(__file__).resolve().parent.parent / "dashboards" / "grafana"
SCHEMA = GRAFANA_DIR / "schema" / "dashboard.openapi.json"
REGENERATE = "generated dashboards are stale: run `tailguard dashboards --out dashboards/grafana`"


@pytest.fixture(scope="module")
def generated() -> dict[str, dict]:
    return build_all(load_spec())


def panels_of(data: dict) -> list[dict]:
    """Every panel, rows' children included, rows themselves excluded."""
    found = []
    for panel in data.get("panels", []):
        found += panels_of(panel) if panel["type"] == "row" else [panel]
    return found


def exprs_of(data: dict) -> list[str]:
    return [t["expr"] for p in panels_of(data) for t in p.get("targets", [])]


def panel(data: dict, title: str) -> dict:
    matches = [p for p in panels_of(data) if p["title"] == title]
    assert len(matches) == 1, f"{len(matches)} panels titled {title!r}"
    return matches[0]


# --- golden files ---------------------------------------------------------------------

def test_committed_dashboards_are_a_fresh_generation(generated):
    committed = sorted(p.name for p in GRAFANA_DIR.glob("*.json"))
    assert committed == sorted(DASHBOARDS), REGENERATE
    for name, data in generated.items():
        assert (GRAFANA_DIR / name).read_text(encoding="utf-8") == render(data), REGENERATE


def test_generation_is_deterministic(generated):
    again = build_all(load_spec())
    assert [render(d) for d in again.values()] == [render(d) for d in generated.values()]


def test_the_command_writes_the_committed_files(tmp_path):
    result = invoke("dashboards", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    written = [Path(line) for line in result.stdout.splitlines()]
    assert sorted(p.name for p in written) == sorted(DASHBOARDS)
    for path in written:
        assert path.read_text(encoding="utf-8") == (GRAFANA_DIR / path.name).read_text(
            encoding="utf-8"), REGENERATE


# --- validation against Grafana's schema and the SDK's models ---------------------------

def schema_validator() -> jsonschema.protocols.Validator:
    """The vendored OpenAPI 3.0 schema of the dashboard kind, rooted at `Dashboard`.

    OpenAPI 3.0 schema objects use draft 4's boolean `exclusiveMinimum`/`Maximum`;
    the schema's generator (cog) also writes draft 6's `const`, so draft 4 plus `const`.
    """
    doc = json.loads(SCHEMA.read_text(encoding="utf-8"))
    root = {"$ref": "#/components/schemas/Dashboard", "components": doc["components"]}
    validator = jsonschema.validators.extend(
        jsonschema.Draft4Validator, {"const": jsonschema.Draft6Validator.VALIDATORS["const"]})
    validator.check_schema(root)
    return validator(root)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_each_dashboard_satisfies_the_official_dashboard_schema(generated, name):
    errors = sorted(schema_validator().iter_errors(generated[name]), key=lambda e: e.path)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


@pytest.mark.parametrize("breakage", [
    lambda d: d["panels"][1]["gridPos"].update(w=25),
    lambda d: d["panels"][1].update(colour="red"),
    lambda d: d["templating"]["list"][0].update(type="dropdown"),
    lambda d: d.pop("schemaVersion"),
    lambda d: d["panels"][0].pop("collapsed"),
], ids=["panel wider than the grid", "unknown panel key", "unknown variable type",
        "no schemaVersion", "row without collapsed"])
def test_the_schema_check_rejects_a_broken_dashboard(generated, breakage):
    broken = json.loads(render(generated["engine.json"]))
    breakage(broken)
    assert not schema_validator().is_valid(broken)


def sdk_round_trip(data: dict) -> dict:
    """Decode with the SDK's typed models (panel options, field config and Prometheus
    targets included, once its plugins are registered), then encode again."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from grafana_foundation_sdk.cog.encoder import JSONEncoder
        from grafana_foundation_sdk.cog.plugins import register_default_plugins
        from grafana_foundation_sdk.models.dashboard import Dashboard
    register_default_plugins()
    decoded = Dashboard.from_json(json.loads(json.dumps(data)))
    return json.loads(json.dumps(decoded, cls=JSONEncoder))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_each_dashboard_round_trips_through_the_sdk_models(generated, name):
    """Nothing is lost: every key we emit, at every level, is one the SDK's models
    (generated from Grafana's schemas) know."""
    assert sdk_round_trip(generated[name]) == generated[name]


@pytest.mark.parametrize("where", ["options", "target", "custom field config"])
def test_the_round_trip_drops_a_key_the_sdk_does_not_know(generated, where):
    data = json.loads(render(generated["engine.json"]))
    graph = data["panels"][1]
    {"options": graph["options"], "target": graph["targets"][0],
     "custom field config": graph["fieldConfig"]["defaults"]["custom"]}[where]["colour"] = 1
    assert sdk_round_trip(data) != data


# --- what the dashboards show ---------------------------------------------------------

def mentions(metric: R.MetricDef, exprs: list[str]) -> bool:
    name = re.compile(rf"\b{metric.prom_name}(_bucket|_sum|_count)?\b")
    return any(name.search(expr) for expr in exprs)


def test_every_registry_metric_is_on_some_dashboard_panel(generated):
    exprs = [e for data in generated.values() for e in exprs_of(data)]
    missing = [m.prom_name for m in R.ALL_METRICS if not mentions(m, exprs)]
    assert not missing, f"on no dashboard panel: {missing}"


def test_every_metric_selector_is_summed_so_exporter_labels_never_split_a_series(generated):
    names = "|".join(m.prom_name for m in R.ALL_METRICS)
    selector = re.compile(rf"\b({names})(_bucket|_sum|_count)?\b")
    # `sum(...)` (a native histogram's heatmap, all series in one) sums every label away
    summed = re.compile(r"sum(?: by \([\w, ]+\) )?\((?:(?:rate|increase)\()?$")
    for expr in (e for data in generated.values() for e in exprs_of(data)):
        for match in selector.finditer(expr):
            assert summed.search(expr[:match.start()]), f"not under sum by (...): {expr}"


def test_every_panel_reads_the_datasource_variable(generated):
    for data in generated.values():
        variables = data["templating"]["list"]
        assert variables[0] == variables[0] | {"name": "datasource", "type": "datasource",
                                               "query": "prometheus"}
        assert {json.dumps(p["datasource"]) for p in panels_of(data)} == {
            json.dumps({"type": "prometheus", "uid": "${datasource}"})}


def test_headers_are_stable_and_say_generated(generated):
    uids = [data["uid"] for data in generated.values()]
    assert uids == [uid_for(data["title"]) for data in generated.values()]
    assert len(set(uids)) == len(uids) and all(len(uid) <= 40 for uid in uids)
    assert all(data["description"].endswith(GENERATED) for data in generated.values())
    assert GENERATED == "Generated by `tailguard dashboards`; DO NOT EDIT."


def test_panel_ids_are_unique_and_panels_fit_the_grid(generated):
    for data in generated.values():
        ids = [p["id"] for p in data["panels"]]
        assert ids == list(range(1, len(ids) + 1))
        assert all(p["gridPos"]["x"] + p["gridPos"]["w"] <= 24 for p in data["panels"])


def test_latency_panels_show_p50_p95_p99_per_context_bucket(generated):
    data = generated["latency.json"]
    bucket_var = data["templating"]["list"][1]
    assert (bucket_var["name"], bucket_var["query"]) == (
        "context_bucket", ",".join(R.CONTEXT_BUCKETS))
    for metric in R.LATENCY_METRICS:
        exprs = [e for e in exprs_of(data) if f"{metric.prom_name}_bucket" in e
                 and e.startswith("histogram_quantile")]
        selected = f'{{context_bucket=~"$context_bucket"}}[$__rate_interval]'
        assert exprs == [  # the classic buckets, or the native histogram kept instead
            f"histogram_quantile({q}, sum by (le, context_bucket) (rate({metric.prom_name}"
            f"_bucket{selected}))) or histogram_quantile({q}, sum by (context_bucket) "
            f"(rate({metric.prom_name}{selected})))"
            for q in QUANTILES], metric.prom_name
    heatmaps = {p["title"] for p in panels_of(data) if p["type"] == "heatmap"}
    assert heatmaps == {"Time to first token heatmap", "End-to-end latency heatmap",
                        "Prompt length heatmap"}


def test_memory_panels_draw_the_90_percent_line(generated):
    assert R.MEMORY_PRESSURE_RATIO == 0.9
    for name, title in [("engine.json", "KV-cache usage"),
                        ("policies.json", "Memory forecast vs measured KV-cache usage")]:
        defaults = panel(generated[name], title)["fieldConfig"]["defaults"]
        assert defaults["thresholds"]["steps"][-1] == {"value": 0.9, "color": "red"}
        assert defaults["custom"]["thresholdsStyle"] == {"mode": "dashed"}


SPEC = """
service: chat
slos:
  - {name: fast_first_token, sli: ttft, objective: 0.995, timeWindow: 7d,
     target: {kind: fixed, seconds: 0.3}}
  - {name: up, sli: availability, objective: 0.999}
"""


def test_the_slo_overview_follows_the_spec():
    data = build_all(parse_spec(SPEC))["slo-overview.json"]
    rows = [p["title"] for p in data["panels"] if p["type"] == "row"]
    assert rows == ["All SLOs", "Clients",
                    "SLO fast_first_token: 99.5% of ttft events good over 1w",
                    "SLO up: 99.9% of availability events good over 30d"]
    assert data["uid"] == "chat-slo-overview"
    clients = {p["title"]: p["targets"][0]["expr"] for p in panels_of(data)
               if p["title"].endswith("per client")}
    good = ('sum by (client) (rate(tailguard_client_requests_total{outcome="good"}'
            '[$__rate_interval]))')
    assert clients == {
        "Goodput per client": good,
        "Attainment per client": f"{good} / sum by (client) (rate(tailguard_client_requests_"
                                 'total{outcome=~"good|late"}[$__rate_interval]))',
        "Shed per client": good.replace('"good"', '"shed"')}
    burn = [p for p in panels_of(data) if p["title"] == "Burn rate by window"][0]
    assert [t["legendFormat"] for t in burn["targets"]] == list(BURN_RATE_WINDOWS) == [
        "5m", "1h", "6h", "1d", "3d"]
    assert burn["targets"][1]["expr"] == (
        'max by (sloth_slo) (slo:sli_error:ratio_rate1h{sloth_service="chat", '
        'sloth_slo="fast_first_token"}) / max by (sloth_slo) (slo:error_budget:ratio'
        '{sloth_service="chat", sloth_slo="fast_first_token"})')
    page = burn["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"]
    assert page == max(w.factor(7 * 86400) for w in BURN_WINDOWS) == 3.36
    assert any("slo:sli_error:ratio_rate1w{" in e for e in exprs_of(data))


def test_the_slo_panels_read_only_what_the_rules_record(generated):
    recorded = {rule.get("record") for group in _rule_groups() for rule in group["rules"]}
    read = {m for e in exprs_of(generated["slo-overview.json"])
            for m in re.findall(r"\bslo:[a-z_]+:[a-z_0-9]+", e)}
    assert read <= recorded, f"read but never recorded: {sorted(read - recorded)}"
    assert {R.RECORD_OBJECTIVE, R.RECORD_PERIOD_BUDGET_REMAINING,
            R.RECORD_SLI_ERROR.format("3d")} <= read


def test_thresholds_and_labels_agree_with_the_rules(generated):
    rules = [rule for group in _rule_groups() for rule in group["rules"]]
    alerts = {rule["alert"]: rule["expr"] for rule in rules if "alert" in rule}
    for name in ("TailguardKVCacheNearlyFull", "TailguardMemoryForecastHigh"):
        assert alerts[name].endswith(f" > {R.MEMORY_PRESSURE_RATIO:g}\n"), name
    bad = f'{R.LABEL_RESULT}="{R.RESULT_BAD}"'
    assert any(bad in rule["expr"] for rule in rules if "record" in rule)
    assert any(bad in e for e in exprs_of(generated["slo-overview.json"]))


def _rule_groups() -> list[dict]:
    try:
        from alerts.rules import rule_groups
    except ImportError:
        pytest.skip("alerts.rules cannot render rules yet")
    return rule_groups(load_spec())["groups"]


# --- the command ------------------------------------------------------------------------

def invoke(*args: str):
    group = Group(name="tailguard", commands={"dashboards": dashboards_command})
    return CliRunner().invoke(group, list(args))


@pytest.mark.parametrize("spec, reason", [
    (None, "cannot read"),
    ("slos: [unclosed", "not valid YAML"),
    ("slos:\n  - {name: up, sli: availability, objective: 2}\n", "objective"),
], ids=["missing spec", "spec is not YAML", "objective out of range"])
def test_a_bad_spec_exits_2_with_one_line(tmp_path, spec, reason):
    path = tmp_path / "spec.yaml"
    if spec is not None:
        path.write_text(spec)
    result = invoke("dashboards", "--slo", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and reason in result.stderr
    assert not (tmp_path / "out").exists()


def test_out_is_required():
    result = invoke("dashboards")
    assert result.exit_code == 2 and "Missing option '--out'" in result.stderr


def test_out_must_be_a_directory(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    result = invoke("dashboards", "--out", str(afile))
    assert result.exit_code == 2 and "is a file" in result.stderr


def test_the_docs_describe_every_dashboard(generated):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "dashboards.md").read_text()
    for name, data in generated.items():
        assert f"### `{name}`: {data['title']}" in doc
