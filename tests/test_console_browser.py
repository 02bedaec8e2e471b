"""The ops console in a real browser: Playwright driving Debian's Chromium against a
`tailguard console` process on the session server. Every page renders its panels
without an error (full-page screenshots land in the artifacts folder), a deep link
opens the app and not a bare page file, and a policy override set through the
Policies page form reaches the server and is undone the same way.

TAILGUARD_UPDATE_SCREENSHOT=1 watches a server of its own judged by the default SLOs
(the session server's spec adds one that every request misses), drives ~40 varied
requests over a minute, and copies the Overview screenshot to docs/console.png (the
README picture).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tailguard.launcher import console_command
from tests.conftest import ADMIN_TOKEN, free_port, start_server, stop_process, stop_server

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(
    not os.access(CHROMIUM, os.X_OK),
    reason=f"no Chromium at {CHROMIUM} (scripts/system-deps.sh installs it)")
playwright = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("TAILGUARD_ARTIFACTS", REPO / "build" / "test-artifacts"))
SHOTS = ARTIFACTS / "console"
README_PICTURE = REPO / "docs" / "console.png"
UPDATE_SCREENSHOT = os.environ.get("TAILGUARD_UPDATE_SCREENSHOT") == "1"
WAIT_MS = 30_000
playwright.expect.set_options(timeout=WAIT_MS)
VIEWPORT = {"width": 1400, "height": 1000}
TITLES = ["Overview", "Latency", "Traces", "Forecasts", "Policies"]
# Per page: the headings it must show and how many charts at least (with data seeded).
PAGES = {
    "Overview": (["Burn rates per window", "Requests and goodput"], 2),
    "Latency": (["TTFT P50 / P95 / P99 by context bucket",
                 "Context length: now against the last hour and day", "Outcomes"], 2),
    "Traces": (["Request waterfall", "Slowest requests of the window", "SQL (read-only)"], 1),
    "Forecasts": (["KV-cache usage: forecast against actual", "Live models",
                   "Predicted against actual latency"], 1),
    "Policies": (["Overrides", "Audit log"], 0),
}
POLICY = "token_cap"
ACTIVE = re.compile(r"(^|\s)active$")  # "🔴 active", not "inactive"
WORDS = ("the quick brown fox jumps over a lazy dog while seven tired engineers watch "
         "latency graphs climb past their service level objectives").split()


# --- the console process and the server -------------------------------------------------

def _console_process(server_url: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, TAILGUARD_URL=server_url, TAILGUARD_ADMIN_TOKEN=ADMIN_TOKEN,
               TAILGUARD_CONSOLE_REFRESH_S="2")
    for name in ("TAILGUARD_ADMIN_TOKEN_FILE", "TAILGUARD_CONSOLE_DB", "TAILGUARD_CONSOLE_SLO"):
        env.pop(name, None)
    process = subprocess.Popen(console_command(port), env=env, stdout=log.open("w"),
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the console exited ({process.returncode}):\n"
                               f"{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.3)
    _stop(process)
    raise RuntimeError(f"the console did not answer in 30 s:\n{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    stop_process(process, timeout_s=15)


@pytest.fixture(scope="module")
def target(request, tmp_path_factory):
    """The server the console watches: the session's, or (for the README picture) one
    with the default SLOs."""
    if not UPDATE_SCREENSHOT:
        yield request.getfixturevalue("server")
        return
    srv = start_server(tmp_path_factory.mktemp("readme-server"), "--retrain-interval", "0",
                       "--reselect-interval", "0")
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture
def console(target, tmp_path) -> Iterator[str]:
    """A fresh console process: no browser session has opened it yet."""
    process, url = _console_process(target.url, tmp_path / "console.log")
    yield url
    _stop(process)


@pytest.fixture
def browser():
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox"])
        yield chromium
        chromium.close()


def _api(server, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        server.url + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def _policy(server, name: str) -> dict:
    return next(p for p in _api(server, "GET", "/admin/policies")["policies"]
                if p["policy"] == name)


def _seed(server) -> None:
    """Real requests for the charts: a few, or ~40 spread over a minute for the README
    picture (prompts from a few tokens to ~3.5k of the 4k context, 1 to 64 output tokens)."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    model_name = client.models.list().data[0].id
    rng = random.Random(3)

    def one(words: int, max_tokens: int) -> None:
        prompt = " ".join(WORDS[i % len(WORDS)] for i in range(words))
        client.completions.create(model=model_name, prompt=prompt, max_tokens=max_tokens)

    if not UPDATE_SCREENSHOT:
        for words, max_tokens in ((8, 4), (200, 16), (1500, 8), (40, 32)):
            one(words, max_tokens)
    else:
        lengths = [8, 30, 80, 200, 400, 600, 900, 1300, 1800]  # words; ~2 tokens each
        with ThreadPoolExecutor(3) as pool:
            for _ in range(8):  # 8 rounds of 5 requests, 3 at a time, ~8 s apart
                started = time.monotonic()
                list(pool.map(lambda args: one(*args),
                              [(rng.choice(lengths), rng.choice([1, 4, 16, 32, 64]))
                               for _ in range(5)]))
                time.sleep(max(0.0, 8 - (time.monotonic() - started)))
    server.admin("/admin/flush")


# --- browser helpers ------------------------------------------------------------------

def _settle(page) -> None:
    """Until Streamlit has finished the run: no status widget, nothing stale."""
    expect = playwright.expect
    expect(page.locator('[data-testid="stStatusWidget"]')).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator('[data-stale="true"]')).to_have_count(0, timeout=WAIT_MS)


def _heading(page, text: str):
    return page.locator("h1, h2, h3").filter(has_text=re.compile(rf"(^|\s){re.escape(text)}$"))


def _check_page(page, title: str) -> None:
    """The page's header, panels and charts are there, and no error or exception."""
    expect = playwright.expect
    expect(_heading(page, title).first).to_be_visible(timeout=WAIT_MS)
    headings, charts = PAGES[title]
    for text in headings:
        expect(_heading(page, text).first).to_be_visible(timeout=WAIT_MS)
    _settle(page)
    if charts:
        drawn = page.locator('[data-testid="stVegaLiteChart"] svg.marks, '
                             '[data-testid="stVegaLiteChart"] canvas')
        expect(drawn.nth(charts - 1)).to_be_visible(timeout=WAIT_MS)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    errors = page.locator('[data-testid="stAlertContentError"]')
    assert errors.count() == 0, f"{title}: {errors.all_inner_texts()}"


def _nav_labels(page) -> list[str]:
    links = page.locator('[data-testid="stSidebarNavLink"]')
    playwright.expect(links.first).to_be_visible(timeout=WAIT_MS)
    return [text.split("\n")[-1].strip() for text in links.all_inner_texts()]


def _screenshot(page, name: str) -> Path:
    """The whole page: Streamlit scrolls inside <main>, so grow the viewport to fit it."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]')"
                           ".scrollHeight")
    page.set_viewport_size({"width": VIEWPORT["width"],
                            "height": max(VIEWPORT["height"], min(int(height), 8000))})
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.mouse.move(VIEWPORT["width"] // 2, 5)  # no hover effects in the picture
    page.wait_for_timeout(500)  # charts re-layout
    _settle(page)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(VIEWPORT)
    return path


def _state_cell(page, policy: str, column: str):
    """A cell of the Policies state table (a canvas grid; its accessible table is DOM)."""
    table = page.locator('[data-testid="stDataFrame"]').first
    playwright.expect(table.locator('[role="columnheader"]').first).to_be_attached()
    header = [text.strip() for text in table.locator('[role="columnheader"]').all_inner_texts()]
    row = table.locator('[role="row"]').filter(
        has=page.locator('[role="gridcell"][aria-colindex="1"]', has_text=re.compile(
            rf"^{re.escape(policy)}$")))
    return row.locator(f'[role="gridcell"][aria-colindex="{header.index(column) + 1}"]')


def _override_form(page, name: str):
    return page.locator('[data-testid="stForm"]').filter(
        has=page.locator("strong", has_text=re.compile(rf"^{re.escape(name)}$")))


def _apply_override(page, name: str, label: str, reason: str) -> None:
    form = _override_form(page, name)
    playwright.expect(form).to_have_count(1, timeout=WAIT_MS)
    form.get_by_text(label, exact=True).click()
    form.get_by_label("Reason (required)").fill(reason)
    form.get_by_role("button", name="Apply").click()


def _open(browser, url: str):
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    return page


# --- tests ----------------------------------------------------------------------------

def test_every_page_renders_and_an_override_round_trips(target, console, browser):
    server = target
    _seed(server)
    page = _open(browser, console + "/")
    assert _nav_labels(page) == TITLES
    if UPDATE_SCREENSHOT:  # a finer time axis for the picture: 10 s bins
        page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').click()
        page.get_by_role("option", name="5 min", exact=True).click()
        _settle(page)

    shots = {}
    for title in TITLES:
        if title != "Overview":
            page.locator('[data-testid="stSidebarNavLink"]').filter(has_text=title).click()
            page.wait_for_url(re.compile(rf"/{title.lower()}$"), timeout=WAIT_MS)
        _check_page(page, title)
        shots[title] = _screenshot(page, title.lower())
    assert all(path.stat().st_size > 10_000 for path in shots.values())
    if UPDATE_SCREENSHOT:
        shutil.copyfile(shots["Overview"], README_PICTURE)

    # Still on Policies: force token_cap on through its form, then back to auto.
    expect = playwright.expect
    assert _policy(server, POLICY)["override"] is None, "an earlier test left an override"
    restored = False
    try:
        _apply_override(page, POLICY, "force on", "browser test: force on")
        expect(page.get_by_text(f"{POLICY}: force on (effective now: active).")).to_be_visible()
        _settle(page)
        expect(_state_cell(page, POLICY, "effective")).to_have_text(ACTIVE)
        expect(_state_cell(page, POLICY, "mode")).to_have_text("force on")
        expect(_state_cell(page, POLICY, "reason")).to_have_text("browser test: force on")
        expect(_override_form(page, POLICY).locator("p", has=page.locator("strong")).first
               ).to_have_text(re.compile(rf"^{POLICY}\s+\S*\s*active$"))
        described = _policy(server, POLICY)
        assert described["override"]["mode"] == "force_on"
        assert described["override"]["reason"] == "browser test: force on"
        assert described["override"]["actor"] == "console via 127.0.0.1"
        assert described["effective"] == "active"
        _screenshot(page, "policies-forced")

        _apply_override(page, POLICY, "auto", "browser test: back to auto")
        expect(page.get_by_text(f"{POLICY}: auto (effective now:")).to_be_visible()
        _settle(page)
        expect(_state_cell(page, POLICY, "mode")).to_have_text("auto")
        described = _policy(server, POLICY)
        assert described["override"] is None
        assert described["effective"] == described["state"]
        audit = _api(server, "GET", "/admin/audit")["overrides"]
        assert [o["reason"] for o in audit[:2]] == ["browser test: back to auto",
                                                     "browser test: force on"]
        events = _api(server, "POST", "/admin/query", {"sql": (
            "SELECT from_state, to_state, reason FROM policy_events WHERE policy = "
            f"'{POLICY}' AND reason LIKE 'override by console via %' ORDER BY ts DESC "
            "LIMIT 2")})["rows"]
        assert events == [["force_on", "auto", "override by console via 127.0.0.1: "
                           "browser test: back to auto"],
                          ["auto", "force_on", "override by console via 127.0.0.1: "
                           "browser test: force on"]]
        restored = True
    finally:
        if not restored:
            try:
                _api(server, "PUT", f"/admin/policies/{POLICY}",
                     {"mode": "auto", "reason": "test cleanup"})
            except urllib.error.URLError:
                pass
        page.close()


def test_a_deep_link_opens_the_app_not_a_bare_page_file(console, browser):
    """The first visit to a fresh console is a bookmarked /policies: it must get the
    app (its navigation, sidebar settings), not Streamlit's pages/ directory mode."""
    page = _open(browser, console + "/policies")
    _check_page(page, "Policies")
    assert _nav_labels(page) == TITLES
    playwright.expect(page.locator('[data-testid="stSidebar"]').get_by_text(
        "Auto-refresh (s, 0 = off)")).to_be_visible()
    page.close()
