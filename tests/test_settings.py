"""observe/settings.py: the one module that reads and writes environment variables.

Product code reaches the environment only through it (checked on the source), and
each setting resolves argument -> environment variable -> default as before."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from observe import settings
from observe.settings import (
    OTEL_METRIC_EXPORT_INTERVAL,
    TAILGUARD_ADMIN_QUERY_SLOTS,
    TAILGUARD_ADMIN_TOKEN,
    TAILGUARD_ENGINE_HANG_S,
    TAILGUARD_PROFILE_SERVER,
    TAILGUARD_RETRAIN_S,
    TAILGUARD_TCMALLOC,
    TAILGUARD_TRACE_FLUSH_S,
)

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("observe", "slo", "serving", "loadgen", "dashboards", "alerts", "tailguard")
SETTINGS_FILE = ROOT / "observe" / "settings.py"
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(source: str) -> list[int]:
    """Lines that touch the process environment directly: `os.environ`, `os.getenv`,
    `getenv(...)`, `from os import environ` and the like. Comments and docstrings are
    not code, so a mention there does not count."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" \
                and {alias.name for alias in node.names} & ENVIRONMENT_NAMES:
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getenv":
            found.append(node.lineno)
    return sorted(found)


def product_files() -> list[Path]:
    return sorted(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))


def test_only_the_settings_module_touches_the_environment():
    uses = {str(path.relative_to(ROOT)): lines for path in product_files()
            if path != SETTINGS_FILE and (lines := environment_uses(path.read_text()))}
    assert uses == {}, "read and write environment variables through observe/settings.py"


@pytest.mark.parametrize(("source", "lines"), [
    ("import os\nx = os.environ.get('A')\n", [2]),
    ("import os\nos.environ['A'] = '1'\n", [2]),
    ("import os\n\n\nx = os.getenv('A')\n", [4]),
    ("from os import environ, getenv\nx = getenv('A')\n", [1, 2]),
    ("def f(env=os.environ):\n    pass\n", [1]),
    ('"""Reads os.environ (a docstring)."""\n# os.getenv("A") in a comment\nx = "getenv("\n', []),
], ids=["a read", "a write", "getenv", "imported names", "a default argument",
        "docstrings, comments and strings are not code"])
def test_the_check_finds_each_way_of_touching_the_environment(source, lines):
    assert environment_uses(source) == lines


def test_the_engine_plugin_imports_settings_without_heavy_packages():
    # vLLM imports the step plugin in every engine process: it must stay cheap
    code = ("import sys, serving.engine.step_plugin\n"
            "print(sorted(m for m in ('duckdb', 'pyarrow', 'opentelemetry', 'torch')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


# --- reading ------------------------------------------------------------------------
def test_a_number_comes_from_the_environment_else_the_default(monkeypatch):
    monkeypatch.delenv(TAILGUARD_RETRAIN_S, raising=False)
    assert settings.number(TAILGUARD_RETRAIN_S, 600.0) == 600.0
    monkeypatch.setenv(TAILGUARD_RETRAIN_S, "")
    assert settings.number(TAILGUARD_RETRAIN_S, 600.0) == 600.0  # empty means unset
    monkeypatch.setenv(TAILGUARD_RETRAIN_S, "90")
    assert settings.number(TAILGUARD_RETRAIN_S, 600.0) == 90.0
    assert settings.number(TAILGUARD_RETRAIN_S, 600, int) == 90


def test_a_bad_number_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(TAILGUARD_RETRAIN_S, "soon")
    with pytest.raises(ValueError) as caught:
        settings.number(TAILGUARD_RETRAIN_S, 600.0)
    assert str(caught.value) == ("environment variable TAILGUARD_RETRAIN_S='soon' "
                                 "is not a valid float")


def test_the_trace_flush_interval_treats_empty_as_a_mistake(monkeypatch):
    from observe.tracelog.setup import TraceLogConfig

    monkeypatch.setenv(TAILGUARD_TRACE_FLUSH_S, "")
    with pytest.raises(ValueError) as caught:
        TraceLogConfig()
    assert str(caught.value) == "TAILGUARD_TRACE_FLUSH_S must be a number, got ''"


def test_query_slots_resolve_argument_then_environment_then_default(monkeypatch):
    from serving.admin.query import DEFAULT_QUERY_SLOTS, AdminQueryConfig

    monkeypatch.delenv(TAILGUARD_ADMIN_QUERY_SLOTS, raising=False)
    assert AdminQueryConfig().slots == DEFAULT_QUERY_SLOTS == 2
    monkeypatch.setenv(TAILGUARD_ADMIN_QUERY_SLOTS, "4")
    assert AdminQueryConfig().slots == 4
    assert AdminQueryConfig(slots=3).slots == 3
    monkeypatch.setenv(TAILGUARD_ADMIN_QUERY_SLOTS, "many")
    with pytest.raises(ValueError) as caught:
        AdminQueryConfig()
    assert str(caught.value) == "TAILGUARD_ADMIN_QUERY_SLOTS must be an integer, got 'many'"


def test_the_otlp_interval_is_read_in_milliseconds(monkeypatch):
    from observe.otlp import _env_interval_s

    monkeypatch.delenv(OTEL_METRIC_EXPORT_INTERVAL, raising=False)
    assert _env_interval_s() == 15.0
    monkeypatch.setenv(OTEL_METRIC_EXPORT_INTERVAL, "2500")
    assert _env_interval_s() == 2.5


@pytest.mark.parametrize(("raw", "expected", "warned"), [
    (None, 60.0, False), ("  ", 60.0, False), ("7.5", 7.5, False), ("0", 0.0, False),
    ("soon", 60.0, True), ("-1", 60.0, True), ("nan", 60.0, True),
])
def test_a_lenient_number_falls_back_to_the_default_and_says_so(
        monkeypatch, caplog, raw, expected, warned):
    if raw is None:
        monkeypatch.delenv(TAILGUARD_ENGINE_HANG_S, raising=False)
    else:
        monkeypatch.setenv(TAILGUARD_ENGINE_HANG_S, raw)
    value = settings.number_or_default(TAILGUARD_ENGINE_HANG_S, 60.0, valid=lambda v: v >= 0,
                                       want="seconds >= 0")
    assert value == expected
    assert [r.getMessage() for r in caplog.records] == (
        [f"ignoring TAILGUARD_ENGINE_HANG_S={raw.strip()!r} (want seconds >= 0)"]
        if warned else [])


def test_an_empty_admin_token_is_set_not_absent(monkeypatch):
    monkeypatch.setenv(TAILGUARD_ADMIN_TOKEN, "")
    assert settings.is_set(TAILGUARD_ADMIN_TOKEN) and settings.get(TAILGUARD_ADMIN_TOKEN) == ""
    assert settings.text(TAILGUARD_ADMIN_TOKEN, "fallback") == "fallback"
    monkeypatch.delenv(TAILGUARD_ADMIN_TOKEN)
    assert not settings.is_set(TAILGUARD_ADMIN_TOKEN)
    assert settings.get(TAILGUARD_ADMIN_TOKEN) is None


@pytest.mark.parametrize(("raw", "expected"), [
    (None, True), ("1", True), ("yes", True), ("0", False), (" Off ", False), ("FALSE", False),
    ("no", False),
])
def test_a_flag_is_off_only_when_switched_off(raw, expected):
    environ = {} if raw is None else {TAILGUARD_TCMALLOC: raw}
    assert settings.flag(TAILGUARD_TCMALLOC, True, environ) is expected


def test_a_child_environment_is_read_instead_of_this_process(monkeypatch):
    from serving.profiling import profiling_config_from

    monkeypatch.setenv(TAILGUARD_PROFILE_SERVER, "http://here:4040")
    assert settings.get(TAILGUARD_PROFILE_SERVER, None, {}) is None
    assert profiling_config_from(None, {}) is None
    assert profiling_config_from().server_url == "http://here:4040"
    assert profiling_config_from("http://arg:4040").server_url == "http://arg:4040"


# --- writing ------------------------------------------------------------------------
@pytest.fixture
def fake_environ(monkeypatch):
    environ = {"KEPT": "1", "CHANGED": "old", "GONE": "x"}
    monkeypatch.setattr(os, "environ", environ)
    return environ


def ours(environ: dict) -> dict:
    """Without the variable pytest itself sets around each test phase."""
    return {k: v for k, v in environ.items() if k != "PYTEST_CURRENT_TEST"}


def test_writers_export_withdraw_and_default(fake_environ):
    settings.export("SOCKET", "/tmp/a")
    settings.withdraw("SOCKET", "/tmp/other")  # someone else's value: left alone
    assert fake_environ["SOCKET"] == "/tmp/a"
    settings.withdraw("SOCKET", "/tmp/a")
    assert "SOCKET" not in fake_environ
    settings.set_defaults({"KEPT": "2", "NEW": "3"})  # the operator's value wins
    assert ours(fake_environ) == {"KEPT": "1", "CHANGED": "old", "GONE": "x", "NEW": "3"}


def test_a_forked_child_takes_its_parents_environment_exactly(fake_environ):
    parent = {"KEPT": "1", "CHANGED": "new", "ADDED": "y"}
    settings.replace_all(parent)
    assert fake_environ == parent


def test_a_child_environment_is_this_one_with_overrides(fake_environ):
    child = settings.child_environ({"CHANGED": "new"})
    assert ours(child) == {"KEPT": "1", "CHANGED": "new", "GONE": "x"}
    assert fake_environ["CHANGED"] == "old" and settings.snapshot() is not fake_environ
