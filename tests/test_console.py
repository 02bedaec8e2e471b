"""The ops console (dashboards/console), every page in Streamlit's AppTest: against the
real session server (admin API, data seeded by real completions), against a server
that refuses the token or is not there, and against a read-only trace file."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from streamlit.proto.Metric_pb2 import Metric as MetricProto
from streamlit.testing.v1 import AppTest

from dashboards.console import queries
from dashboards.console.auth import console_password
from dashboards.console.client import AdminClient
from observe.tracelog import TraceLog
from slo.policy import conditions as P
from slo.predict.accuracy import GATE_EVENT
from tests.conftest import ADMIN_TOKEN, free_port

APP = str(Path(__file__).resolve().parent.parent / "dashboards" / "console" / "app.py")
OVERVIEW, LATENCY, TRACES, FORECASTS, POLICIES = (
    "views/overview.py", "views/latency.py", "views/traces.py", "views/forecasts.py",
    "views/policies.py")
PAGES = (OVERVIEW, LATENCY, TRACES, FORECASTS, POLICIES)
ALL_POLICIES = {P.BREAKER_L1, P.BREAKER_L2, P.TOKEN_CAP, P.VIP_ONLY, P.MEMORY_PRESSURE,
                P.TRUNCATION, P.PREDICTED_MISS, P.BATCH_CONTROL}
SEEDS = ("console-seed-0", "console-seed-1", "console-seed-2")
SLOW = "console-slow"
NEEDS_SERVER = "This panel needs a running server"


@pytest.fixture(autouse=True)
def on_loopback(monkeypatch):
    """AppTest leaves Streamlit's server.address unset (every interface, so the login
    gate would ask): say the console listens where `tailguard console` puts it."""
    monkeypatch.setenv("TAILGUARD_CONSOLE_HOST", "127.0.0.1")
    monkeypatch.delenv("TAILGUARD_CONSOLE_AUTH", raising=False)


@pytest.fixture
def live(monkeypatch, server):
    monkeypatch.delenv("TAILGUARD_CONSOLE_DB", raising=False)
    monkeypatch.delenv("TAILGUARD_ADMIN_TOKEN_FILE", raising=False)
    monkeypatch.delenv("TAILGUARD_CONSOLE_REFRESH_S", raising=False)
    monkeypatch.setenv("TAILGUARD_URL", server.url)
    monkeypatch.setenv("TAILGUARD_ADMIN_TOKEN", ADMIN_TOKEN)
    return AdminClient(server.url, ADMIN_TOKEN)


@pytest.fixture(scope="module")
def seeded(server, client, model_name):
    """Three short completions and a longer one, with known request ids, flushed."""
    for request_id in SEEDS:
        client.completions.create(model=model_name, prompt="console data", max_tokens=4,
                                  extra_headers={"X-Request-Id": request_id})
    client.completions.create(model=model_name, prompt="console slow request", max_tokens=64,
                              extra_body={"ignore_eos": True},
                              extra_headers={"X-Request-Id": SLOW})
    server.admin("/admin/flush")
    return server


def open_app(page: str | None = None) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    assert not app.exception, app.exception
    if page not in (None, OVERVIEW):
        app.switch_page(page).run()
        assert not app.exception, app.exception
    return app


def rerun(target) -> AppTest:
    """Run again after an interaction (`target`: the AppTest or the widget touched)."""
    app = target.run()
    assert not app.exception, app.exception
    return app


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def test_a_trace_file_forecasts_page_shows_the_last_retrain_decision(trace_file):
    app = open_app(FORECASTS)
    assert "Latency predictor: no retrain decision yet." in texts(app.caption)
    now = time.time()
    with TraceLog(trace_file) as log:
        for age, accepted, reason in ((600, True, "accepted: TTFT p50 median APE 4.2% < 37.6%"),
                                      (180, False, "refused: TPOT p50 median APE 9.0% is not "
                                                   "below the live model's 3.9%")):
            log.add("policy_events", {
                "ts": now - age, "policy": GATE_EVENT, "from_state": "hgb-1",
                "to_state": "hgb-1", "reason": reason,
                "details": {"accepted": accepted, "trigger": "periodic"}})
    app = rerun(app)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now - 180))
    (line,) = [m for m in texts(app.markdown) if m.startswith("**Last latency retrain**")]
    assert line == (f"**Last latency retrain** ({stamp} UTC, 3 min ago, periodic): "
                    ":orange[refused]: TPOT p50 median APE 9.0% is not below the live "
                    "model's 3.9%")


def charts(app: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in app.get("vega_lite_chart")]


def chart_rows(chart) -> list[dict]:
    """A chart's data: Streamlit ships it beside the spec, as Arrow."""
    import pyarrow as pa

    return [row for named in chart.proto.datasets
            for row in pa.ipc.open_stream(named.data.data).read_all().to_pylist()]


def metrics(app: AppTest) -> list[tuple[str, str]]:
    return [(m.label, m.value) for m in app.metric]


def run_query(app: AppTest) -> AppTest:
    return rerun(next(b for b in app.button if b.label == "Run query").click())


def submit(app: AppTest, form: str) -> AppTest:
    (button,) = [b for b in app.button if b.proto.form_id == form]
    return rerun(button.click())


def get(url: str, path: str) -> dict:
    request = urllib.request.Request(url + path,
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def policy(url: str, name: str) -> dict:
    return next(p for p in get(url, "/admin/policies")["policies"] if p["policy"] == name)


# --- live pages ------------------------------------------------------------------------

def test_overview_shows_every_slo_goodput_burn_rates_and_the_policy_banner(live, seeded):
    app = open_app()
    status = live.slo()
    overall = [s for s in status["slos"] if not s["group"]]
    assert [s["name"] for s in overall] == ["ttft", "first_token_health", "tpot", "e2e",
                                            "availability", "error_rate", "ttft_breach"]
    # ttft_breach (a 1 us target) fails every request: red, and every burn alert fires.
    assert texts(app.header) == [":red[●] Overview"]
    # One card per SLO, six columns: the seventh wraps under the first (column-major).
    cards = [m for m in texts(app.markdown) if "objective" in m]
    attainment = [v for label, v in metrics(app) if label == "attainment"]
    shown = {card.split("**")[1]: (card, value) for card, value in zip(cards, attainment)}
    assert len(cards) == len(shown) == len(overall)
    assert {name: value for name, (_, value) in shown.items()} == {
        s["name"]: f"{s['attainment']:.3%}" for s in overall}
    card, value = shown["ttft_breach"]
    assert card == ":red[●] **ttft_breach**  ·  objective 99.00%" and value == "0.000%"
    assert ("page 1h/5m > 14.4x, page 6h/30m > 6x, ticket 1d/2h > 3x, ticket 3d/6h > 1x"
            in texts(app.caption))
    # No request meets ttft_breach, so none counts as goodput.
    assert [m for m in metrics(app) if m[0].startswith("goodput")] == [
        ("goodput 5m", "0.000 req/s"), ("goodput 1h", "0.000 req/s"),
        ("goodput 1d", "0.000 req/s")]
    assert texts(app.subheader) == ["Burn rates per window", "Requests and goodput", "Tenants"]
    heatmap, flow = charts(app)
    assert [layer["mark"]["type"] for layer in heatmap["layer"]] == ["rect", "text"]
    assert heatmap["layer"][0]["encoding"]["color"]["field"] == "burn_rate"
    # the cells read what GET /admin/slo says: every window of the always-failing
    # ttft_breach burns at 100x (100% bad / 1% budget), availability's at 0
    cells = {(row["slo"], row["window"]): row["burn_rate"]
             for row in chart_rows(app.get("vega_lite_chart")[0])}
    for slo, burn in (("ttft_breach", 100.0), ("availability", 0.0)):
        windows = [w for s in overall if s["name"] == slo for w in s["windows"]
                   if (slo, w["window"]) in cells]
        assert windows and all(cells[(slo, w["window"])] == pytest.approx(w["burn_rate"])
                               == pytest.approx(burn) for w in windows), (slo, cells)
    assert flow["encoding"]["y"]["field"] == "per_s"
    groups, tenants = (d.value for d in app.dataframe)
    assert "0-1k" in set(groups["context_bucket"])
    # A server without a keys file: every caller is the one tenant `anonymous`.
    (anonymous,) = tenants.to_dict("records")
    assert anonymous["client"] == "anonymous" and anonymous["requests"] >= len(SEEDS) + 1
    assert anonymous["good"] == 0 and anonymous["late"] >= len(SEEDS) + 1  # ttft_breach
    # The banner says what GET /admin/policies says.
    data = live.policies()
    acting = [p["policy"] for p in data["policies"]
              if p["effective"] != "inactive" and p["policy"] != P.BATCH_CONTROL]
    limit = data["decisions"]["concurrency_limit"]
    if acting:
        (banner,) = texts(app.warning)
        assert banner.startswith("Active policies: ") and all(p in banner for p in acting)
    else:
        assert texts(app.success) == [
            f"No degradation policy is acting; concurrency limit {limit}."]
        assert not app.warning
    # The server's own health: its event loop's lag over the last minute.
    (lag,) = [c for c in texts(app.caption) if "Server event loop lag" in c]
    assert re.fullmatch(r":(green|orange|red)\[●\] Server event loop lag, last minute: p99 "
                        r"[\d.]+ ms, max [\d.]+ ms \(\d+ samples\); worst since start \d+ ms\.",
                        lag), lag


def test_latency_metric_radio_switches_the_chart(live, seeded):
    app = open_app(LATENCY)
    assert texts(app.header) == ["Latency"]
    (radio,) = app.radio
    assert radio.options == ["TTFT", "TPOT", "end to end"] and radio.value == "TTFT"
    for label in ("TTFT", "TPOT", "end to end"):
        app = rerun(app.radio(key="latency_metric").set_value(label))
        assert texts(app.subheader) == [
            f"{label} P50 / P95 / P99 by context bucket",
            "Context length: now against the last hour and day",
            "Length classes (seed 000: re-bucketed every 5 s from p25 / p75)", "Outcomes"]
        over_time, shares, bounds = charts(app)
        assert over_time["encoding"]["y"]["title"] == f"{label} (s)"
        assert shares["encoding"]["x"]["title"] == "prompt tokens (from)"
        assert bounds["encoding"]["y"]["title"] == "boundary (prompt tokens)"
    by_bucket, classes, outcomes = (d.value for d in app.dataframe)
    assert "0-1k" in set(by_bucket["context_bucket"])
    assert {"ttft_p99", "tpot_p99", "e2e_p99", "met_every_slo"} <= set(by_bucket.columns)
    # the percentiles are the trace log's own over the window (the default 15 minutes)
    (exact,) = seeded.sql(
        "SELECT count(*) AS n, quantile_cont(ttft_s, 0.99) AS ttft, quantile_cont(e2e_s, 0.5) "
        "AS e2e FROM requests WHERE status = 'ok' AND context_bucket = '0-1k' "
        "AND arrival_ts > now() - INTERVAL 15 MINUTE")
    shown = by_bucket.set_index("context_bucket").loc["0-1k"]
    assert (shown["requests"], shown["ttft_p99"], shown["e2e_p50"]) == (
        exact["n"], pytest.approx(exact["ttft"]), pytest.approx(exact["e2e"]))
    # the length classes agree with the trace log: every served request of the window,
    # each under the boundaries it was classed by
    (expected,) = seeded.sql(
        "SELECT count(*) FILTER (prompt_tokens <= length_class_low) AS short, "
        "count(*) FILTER (prompt_tokens > length_class_low AND prompt_tokens <= "
        "length_class_high) AS medium, count(*) FILTER (prompt_tokens > length_class_high) "
        "AS long FROM requests WHERE status = 'ok' AND length_class_low IS NOT NULL "
        "AND arrival_ts > now() - INTERVAL 15 MINUTE")  # the default window
    shown = dict(zip(classes["length_class"], classes["requests"]))
    assert shown == {k: v for k, v in expected.items() if v}
    ok = outcomes[outcomes["status"] == "ok"]["requests"]
    assert len(ok) == 1 and ok.iloc[0] >= len(SEEDS) + 1


def test_traces_slowest_requests_and_a_request_waterfall(live, seeded):
    app = open_app(TRACES)
    assert texts(app.subheader) == ["Request waterfall", "Slowest requests of the window",
                                    "SQL (read-only)"]
    slowest = app.dataframe[-1].value
    expected = live.query(queries.slowest_requests(15))["request_id"].tolist()
    assert slowest["request_id"].tolist() == expected
    assert SLOW in expected
    # With no id entered, the slowest request's waterfall is shown.
    assert "Showing the slowest request" in texts(app.caption)[0]
    assert app.dataframe[0].value.columns.tolist() == [expected[0]]

    app = rerun(app.text_input(key="request_id").input(SEEDS[1]))
    (waterfall,) = charts(app)
    assert waterfall["encoding"]["y"]["field"] == "phase"
    assert waterfall["encoding"]["x2"]["field"] == "end_s"
    assert not app.info and not app.error
    row = app.dataframe[0].value
    assert row.columns.tolist() == [SEEDS[1]]
    assert row.loc["request_id", SEEDS[1]] == SEEDS[1]
    assert row.loc["status", SEEDS[1]] == "ok"
    assert row.loc["context_bucket", SEEDS[1]] == "0-1k"
    spans = live.query(queries.waterfall(SEEDS[1]))
    assert spans["phase"].iloc[0] == "llm.request" and "llm.decode" in set(spans["phase"])

    app = rerun(app.text_input(key="request_id").input("x' OR '1'='1"))
    assert any("a request id is" in e for e in texts(app.error))
    assert not charts(app)


def test_traces_sql_box_runs_examples_edits_and_refuses_writes(live, seeded, server):
    app = open_app(TRACES)
    example = "P99 TTFT by context bucket (1 h)"
    app = rerun(app.selectbox(key="example").select(example))
    assert app.text_area(key="sql").value == queries.EXAMPLES[example]
    app = run_query(app)
    (result,) = [d.value for d in app.dataframe if "ttft_p99" in d.value.columns]
    assert result.columns.tolist() == ["context_bucket", "requests", "ttft_p99"]
    assert result.set_index("context_bucket").loc["0-1k", "requests"] >= len(SEEDS) + 1

    sql = "SELECT request_id FROM requests WHERE request_id LIKE 'console-seed-%' ORDER BY 1"
    app.text_area(key="sql").input(sql)
    app = run_query(app)
    result = app.dataframe[-1].value
    assert result["request_id"].tolist() == list(SEEDS)
    assert "3 rows" in texts(app.caption)
    (download,) = app.get("download_button")
    assert download.proto.label == "Download CSV"

    app.text_area(key="sql").input("SELECT i FROM range(10005) t(i)")
    app = run_query(app)
    assert len(app.dataframe[-1].value) == 10_000
    (cut,) = texts(app.warning)
    assert cut.startswith("Only the first 10,000 rows are shown"), cut
    app.text_area(key="sql").input(sql)
    assert not run_query(app).warning  # a whole answer says nothing

    count = "SELECT count(*) AS n FROM requests"
    before = server.sql(count)[0]["n"]
    for bad in ("DELETE FROM requests", "SELEC request_id FROM requests",
                "SELECT 1; DROP TABLE requests"):
        app.text_area(key="sql").input(bad)
        app = run_query(app)
        (error,) = texts(app.error)
        assert error.startswith("Query refused: "), error
        assert not app.get("download_button")  # the last good result is gone
    assert server.sql(count)[0]["n"] == before  # nothing was deleted
    assert live.query("SELECT 42 AS answer")["answer"].tolist() == [42]


def test_forecasts_show_the_live_models(live, seeded):
    app = open_app(FORECASTS)
    models = live.models()
    assert texts(app.subheader) == ["KV-cache usage: forecast against actual", "Live models",
                                    "Predicted against actual latency"]
    shown = dict(metrics(app))
    assert shown["memory forecaster"] == models["memory"]["model"]
    assert shown["latency predictor"] == models["latency"]["version"]
    horizon = f"KV forecast in {models['memory']['horizon_s'] / 60:g} min"
    assert horizon in shown
    assert not app.error


def test_policies_page_lists_all_eight_policies(live):
    app = open_app(POLICIES)
    assert texts(app.header) == ["Policies"]
    table = app.dataframe[0].value
    assert set(table["policy"]) == ALL_POLICIES and len(table) == 8
    assert table["policy"].tolist() == [p["policy"] for p in live.policies()["policies"]]
    assert texts(app.subheader) == ["Overrides", "Audit log"]
    assert {f.proto.form_id for f in app.button} == {f"override-{p}" for p in ALL_POLICIES}
    assert texts(app.caption)[0].startswith("Signals: P99 ")


def test_an_override_from_the_policies_page_reaches_the_server(live, server):
    name = P.TOKEN_CAP
    assert policy(server.url, name)["override"] is None
    app = open_app(POLICIES)
    try:
        # No reason: refused by the page, nothing sent.
        app.radio(key=f"mode-{name}").set_value("force_on")
        app = submit(app, f"override-{name}")
        assert texts(app.error) == [f"{name}: an override needs a reason."]
        assert policy(server.url, name)["override"] is None

        app.radio(key=f"mode-{name}").set_value("force_on")
        app.text_input(key=f"reason-{name}").input("console test: force on")
        app = submit(app, f"override-{name}")
        assert texts(app.success) == [f"{name}: force on (effective now: active)."]
        state = policy(server.url, name)
        assert state["effective"] == "active"
        assert state["override"]["mode"] == "force_on"
        assert state["override"]["reason"] == "console test: force on"
        assert state["override"]["actor"] == "console via 127.0.0.1"
        # The page shows it: table row, the cleared reason box, the audit log.
        row = app.dataframe[0].value.set_index("policy").loc[name]
        assert row["mode"] == "force on" and row["reason"] == "console test: force on"
        assert row["effective"] == "🔴 active"
        assert app.text_input(key=f"reason-{name}").value == ""
        assert app.radio(key=f"mode-{name}").value == "force_on"
        audit = app.dataframe[1].value
        assert audit.iloc[0]["policy"] == name and audit.iloc[0]["mode"] == "force_on"
        # ...and so does the Overview banner.
        app.switch_page(OVERVIEW)
        app = rerun(app)
        (banner,) = texts(app.warning)
        assert f"**{name}** (active, forced)" in banner
        assert f"Operator overrides in force: {name}" in texts(app.caption)

        app.switch_page(POLICIES)
        app = rerun(app)
        app.radio(key=f"mode-{name}").set_value("auto")
        app.text_input(key=f"reason-{name}").input("console test: done")
        app = submit(app, f"override-{name}")
        assert texts(app.success) == [f"{name}: auto (effective now: inactive)."]
        assert policy(server.url, name)["override"] is None
        assert policy(server.url, name)["effective"] == "inactive"
    finally:
        live.set_policy(name, "auto", "console test cleanup")


def test_the_override_form_follows_the_server_when_an_override_expires(live, server):
    name = P.TOKEN_CAP
    live.set_policy(name, "force_on", "console test: expiring", ttl_s=2)
    try:
        app = open_app(POLICIES)
        assert app.radio(key=f"mode-{name}").value == "force_on"
        deadline = time.monotonic() + 30
        while policy(server.url, name)["override"] is not None:
            assert time.monotonic() < deadline, "the override did not expire"
            time.sleep(0.25)
        app = rerun(app)
        assert app.dataframe[0].value.set_index("policy").loc[name, "mode"] == "auto"
        assert app.radio(key=f"mode-{name}").value == "auto"  # not the expired mode
    finally:
        live.set_policy(name, "auto", "console test cleanup")


def test_the_sidebar_settings_persist_across_pages(live, seeded, monkeypatch):
    monkeypatch.setenv("TAILGUARD_CONSOLE_REFRESH_S", "0")
    app = open_app()
    (window,) = app.sidebar.selectbox
    assert window.options == list(queries.WINDOWS) and window.value == "15 min"
    (refresh,) = app.sidebar.number_input
    assert refresh.label == "Auto-refresh (s, 0 = off)" and refresh.value == 0
    assert texts(app.sidebar.caption) == [f"Data: {live.url}"]
    app = rerun(app.sidebar.selectbox(key="window").select("1 hour"))
    app = rerun(app.sidebar.number_input(key="refresh_s").set_value(30))
    app.switch_page(LATENCY)
    app = rerun(app)
    assert app.sidebar.selectbox(key="window").value == "1 hour"
    assert app.sidebar.number_input(key="refresh_s").value == 30
    assert "0-1k" in set(app.dataframe[0].value["context_bucket"])
    app = rerun(app.sidebar.selectbox(key="window").select("5 min"))
    assert texts(app.header) == ["Latency"]


@pytest.mark.parametrize("page", PAGES)
def test_a_refused_token_is_explained_on_every_page(live, monkeypatch, page):
    monkeypatch.setenv("TAILGUARD_ADMIN_TOKEN", "wrong-token")
    app = open_app(page)
    assert app.error and all("refused the admin token" in e for e in texts(app.error))


@pytest.mark.parametrize("page", PAGES)
def test_a_missing_server_is_explained_on_every_page(monkeypatch, page):
    monkeypatch.delenv("TAILGUARD_CONSOLE_DB", raising=False)
    monkeypatch.setenv("TAILGUARD_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TAILGUARD_ADMIN_TOKEN", ADMIN_TOKEN)
    app = open_app(page)
    assert app.error and all("is not reachable" in e for e in texts(app.error))


# --- the login gate: a console reachable beyond this machine ----------------------------

def page_content(app: AppTest) -> list:
    """Everything a page or the sidebar shows (the login form shows none of it)."""
    return [*app.header, *app.subheader, *app.metric, *app.dataframe, *app.markdown,
            *app.warning, *app.success, *app.info, *app.get("vega_lite_chart"),
            *app.sidebar.selectbox, *app.sidebar.number_input, *app.sidebar.caption]


def rendered(node) -> str:
    """Every element's protobuf as text: what the browser would be sent."""
    children = getattr(node, "children", None)
    if isinstance(children, dict):
        return "".join(rendered(child) for child in children.values())
    return str(getattr(node, "proto", ""))


def sign_in(app: AppTest, password: str) -> AppTest:
    app.text_input(key="console_password").input(password)
    return submit(app, "login")


def test_an_exposed_console_shows_nothing_until_the_console_password(live, seeded,
                                                                      monkeypatch):
    monkeypatch.setenv("TAILGUARD_CONSOLE_HOST", "0.0.0.0")
    app = open_app()
    assert not page_content(app) and not app.error
    assert texts(app.title) == ["tailguard"]
    (box,) = app.text_input
    assert box.label == "Console password" and box.proto.type == box.proto.PASSWORD
    for wrong in ("wrong", ADMIN_TOKEN):  # the raw admin token is not the password
        app = sign_in(app, wrong)
        assert texts(app.error) == ["Wrong password."] and not page_content(app)
        assert app.text_input(key="console_password").value == ""  # not kept

    app = sign_in(app, console_password(ADMIN_TOKEN))
    assert texts(app.header) == [":red[●] Overview"] and not app.error
    assert texts(app.sidebar.caption) == [f"Data: {live.url}"]
    assert [b.label for b in app.sidebar.button] == ["Sign out"]
    page = rendered(app._tree)
    assert ADMIN_TOKEN not in page and console_password(ADMIN_TOKEN) not in page
    assert console_password(ADMIN_TOKEN) not in str(app.session_state.to_dict())
    app.switch_page(POLICIES)
    app = rerun(app)
    assert texts(app.header) == ["Policies"]

    app = rerun(app.sidebar.button[0].click())  # sign out: the form again, nothing else
    assert not page_content(app) and [t.label for t in app.text_input] == ["Console password"]


def test_a_deep_link_to_a_page_before_signing_in_shows_only_the_login(live, monkeypatch):
    monkeypatch.setenv("TAILGUARD_CONSOLE_HOST", "0.0.0.0")
    app = AppTest.from_file(APP, default_timeout=60)
    app.switch_page(POLICIES).run()
    assert not app.exception, app.exception
    assert not page_content(app) and not app.dataframe and not app.radio
    assert [b.label for b in app.button] == ["Sign in"]


def test_a_loopback_console_asks_only_when_told_to(live, seeded, monkeypatch):
    assert texts(open_app().header) == [":red[●] Overview"]  # today's behaviour
    monkeypatch.setenv("TAILGUARD_CONSOLE_AUTH", "always")
    app = open_app()
    assert not page_content(app) and [b.label for b in app.button] == ["Sign in"]
    app = sign_in(app, console_password(ADMIN_TOKEN))
    assert texts(app.header) == [":red[●] Overview"]


# --- a trace file, no server -----------------------------------------------------------

@pytest.fixture
def trace_file(tmp_path, monkeypatch) -> str:
    """Four requests (one over the 2 s end-to-end target, 400 s ago), spans for one,
    engine seconds, a policy transition and an override, written by the trace log."""
    path = str(tmp_path / "trace.duckdb")
    now = time.time()
    with TraceLog(path) as log:
        for age, e2e, who in ((600, 0.5, "alice"), (400, 3.0, "alice"), (200, 0.4, "bob"),
                              (100, 0.3, "bob")):
            log.add("requests", {
                "request_id": f"file-{age}", "arrival_ts": now - age, "model": "tiny",
                "client": who,
                "status": "ok", "http_status": 200, "priority": "realtime",
                "context_bucket": "0-1k", "prompt_tokens": 10, "output_tokens": 8,
                "queue_s": 0.01, "prefill_s": 0.03, "decode_s": e2e - 0.05, "ttft_s": 0.05,
                "tpot_s": 0.01, "e2e_s": e2e, "slo_ok": e2e < 2})
        start = now - 100
        for name, begin, end in (("llm.request", 0, 0.3), ("llm.queue", 0, 0.01),
                                 ("llm.prefill", 0.01, 0.04), ("llm.decode", 0.04, 0.3)):
            log.add("spans", {"request_id": "file-100", "span_id": name, "name": name,
                              "start_ts": start + begin, "end_ts": start + end,
                              "duration_s": end - begin})
        for age in (30, 20, 10):
            log.add("engine_stats", {"ts": now - age, "running": 1, "waiting": 0,
                                     "kv_cache_usage": 0.25, "preemptions": 0})
        log.add("policy_events", {"ts": now - 50, "policy": P.TOKEN_CAP,
                                  "from_state": "inactive", "to_state": "active",
                                  "reason": "queue depth 7 > 5"})
        log.add("overrides", {"policy": P.VIP_ONLY, "mode": "force_off",
                              "reason": "file test", "actor": "tester",
                              "created_ts": now - 40})
    monkeypatch.setenv("TAILGUARD_CONSOLE_DB", path)
    monkeypatch.delenv("TAILGUARD_CONSOLE_SLO", raising=False)
    monkeypatch.setenv("TAILGUARD_URL", f"http://127.0.0.1:{free_port()}")  # never used
    return path


def test_a_trace_file_gives_slo_cards_without_a_server(trace_file):
    before = time.time()
    app = open_app()
    after = time.time()
    assert texts(app.header) == [":red[●] Overview"]  # e2e: 1 of 4 over 2 s
    assert texts(app.sidebar.caption) == [f"Data: {trace_file} (read-only)"]
    assert any(c.startswith(NEEDS_SERVER) for c in texts(app.caption))
    cards = [m for m in texts(app.markdown) if "objective" in m]
    assert [c.split("**")[1] for c in cards] == [
        "ttft", "first_token_health", "tpot", "e2e", "availability", "error_rate"]
    assert cards[3].startswith(":red[●] **e2e**")
    assert all(c.startswith(":green[●]") for i, c in enumerate(cards) if i != 3)
    attainment = [(m.value, m.delta, m.proto.color) for m in app.metric
                  if m.label == "attainment"]
    ok = ("100.000%", "100.0% budget left", MetricProto.MetricColor.GREEN)
    assert attainment == [ok] * 3 + [
        ("75.000%", "-2400.0% budget left", MetricProto.MetricColor.RED)] + [ok] * 2
    # The bad request is 400 s old: out of the 5 min window, inside 30 min.
    assert "page 6h/30m > 6x, ticket 1d/2h > 3x, ticket 3d/6h > 1x" in texts(app.caption)
    # Goodput: 2 good in the last 5 min / 300 s; 3 good over the 600 s the file spans.
    assert [m for m in metrics(app) if m[0].startswith("goodput")] == [
        ("goodput 5m", "0.007 req/s"), ("goodput 1h", "0.005 req/s"),
        ("goodput 1d", "0.005 req/s")]
    assert len(charts(app)) == 2
    # Tenants over the sidebar's 15 min: alice had the late one; the file spans from its
    # oldest row (600 s before the fixture ran) to the console's clock, read while the app
    # ran, so a slow run moves the divisor but not the check.
    (tenants,) = (d.value for d in app.dataframe if "client" in d.value.columns)
    assert tenants[["client", "requests", "good", "late", "attainment"]].values.tolist() == [
        ["alice", 2, 1, 1, 0.5], ["bob", 2, 2, 0, 1.0]]
    oldest = duckdb.connect(trace_file, read_only=True).sql(
        "SELECT min(epoch(arrival_ts)) FROM requests").fetchall()[0][0]
    alice, bob = tenants["goodput_rps"].tolist()
    assert 1 / (after - oldest) <= alice <= 1 / (before - oldest)
    assert bob == pytest.approx(2 * alice, rel=1e-9)


def test_a_trace_file_policies_page_shows_what_was_recorded(trace_file):
    app = open_app(POLICIES)
    (info,) = texts(app.info)
    assert info.startswith(NEEDS_SERVER)
    events, overrides = (d.value for d in app.dataframe)
    assert events[["policy", "from_state", "to_state", "reason"]].values.tolist() == [
        [P.TOKEN_CAP, "inactive", "active", "queue depth 7 > 5"]]
    assert overrides[["policy", "mode", "reason", "actor"]].values.tolist() == [
        [P.VIP_ONLY, "force_off", "file test", "tester"]]
    assert not app.button and not app.error


def test_a_trace_file_traces_forecasts_and_latency(trace_file):
    app = open_app(TRACES)
    slowest = app.dataframe[-1].value
    assert slowest["request_id"].tolist() == ["file-400", "file-600", "file-200", "file-100"]
    app = rerun(app.text_input(key="request_id").input("file-100"))
    (waterfall,) = charts(app)
    assert waterfall["encoding"]["y"]["field"] == "phase"
    example = "Policy transitions (newest first)"
    app = rerun(app.selectbox(key="example").select(example))
    app = run_query(app)
    result = app.dataframe[-1].value
    assert result[["policy", "to_state"]].values.tolist() == [[P.TOKEN_CAP, "active"]]
    app.text_area(key="sql").input("DROP TABLE requests")
    app = run_query(app)
    assert texts(app.error)[0].startswith("Query refused: ")

    app.switch_page(FORECASTS)
    app = rerun(app)
    assert any(i.startswith(NEEDS_SERVER) for i in texts(app.info))
    assert not app.metric and len(charts(app)) == 1  # the KV-cache forecast panel

    app.switch_page(LATENCY)
    app = rerun(app)
    by_bucket, outcomes = (d.value for d in app.dataframe)
    assert by_bucket["requests"].tolist() == [4]  # the 15 min window holds all four
    assert outcomes.values.tolist() == [["ok", "", 4]]
