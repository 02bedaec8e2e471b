"""The console's first page, in Streamlit's AppTest, against the real server."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from tests.conftest import ADMIN_TOKEN, free_port

APP = str(Path(__file__).resolve().parent.parent / "dashboards" / "console" / "app.py")


def _run(monkeypatch, url: str, token: str) -> AppTest:
    monkeypatch.setenv("TAILGUARD_URL", url)
    monkeypatch.setenv("TAILGUARD_ADMIN_TOKEN", token)
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    assert not app.exception, app.exception
    return app


def test_the_live_page_shows_latency_by_bucket_and_the_trace_log(monkeypatch, server, client,
                                                                  model_name):
    for _ in range(3):
        client.completions.create(model=model_name, prompt="console data", max_tokens=4)
    server.admin("/admin/flush")
    app = _run(monkeypatch, server.url, ADMIN_TOKEN)
    assert [s.value for s in app.subheader] == [
        "TTFT by context bucket", "Outcomes", "Latest requests (trace log)"]
    by_bucket, outcomes, recent = (d.value for d in app.dataframe)
    assert "0-1k" in set(by_bucket["context_bucket"])
    assert {"ttft_p99", "tpot_p99", "e2e_p99", "slo_attainment"} <= set(by_bucket.columns)
    assert outcomes["requests"].sum() >= 3
    assert len(recent) >= 3 and "request_id" in recent.columns


def test_a_bad_token_is_explained_not_a_crash(monkeypatch, server):
    app = _run(monkeypatch, server.url, "wrong-token")
    assert any("refused the admin token" in e.value for e in app.error)


def test_a_missing_server_is_explained_not_a_crash(monkeypatch):
    app = _run(monkeypatch, f"http://127.0.0.1:{free_port()}", ADMIN_TOKEN)
    assert any("not reachable" in e.value for e in app.error)


def test_changing_the_window_reruns_the_page(monkeypatch, server):
    app = _run(monkeypatch, server.url, ADMIN_TOKEN)
    app.sidebar.selectbox[0].select("1 hour").run()
    assert not app.exception and len(app.dataframe) >= 2

