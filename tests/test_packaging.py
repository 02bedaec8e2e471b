"""What a user installs: a wheel built from this tree, with no setuptools warning, into a
fresh virtual environment, runs `tailguard --help`, `tailguard rules` and every page of
the console (Streamlit's AppTest over a trace file) from the installed copy, not from
the checkout. The dependencies come from the test's own environment (a path file), so
the test needs no network; the package itself comes only from the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SKIP_IN_COPY = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                      "tests", "bench", "docs", "*.duckdb")
CONSOLE_PAGES = ("views/overview.py", "views/latency.py", "views/traces.py",
                 "views/forecasts.py", "views/policies.py")


def run(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 300):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel built from a copy of the tree (the checkout stays untouched), and what
    the build printed."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(REPO, source, ignore=SKIP_IN_COPY)
    done = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "-v", "-w", work / "dist", source], cwd=work)
    (wheel,) = (work / "dist").glob("tailguard-*.whl")
    return wheel, done.stdout + done.stderr


@pytest.fixture(scope="module")
def fresh(built, tmp_path_factory) -> tuple[Path, dict]:
    """A new virtual environment holding the wheel; its dependencies reached through a
    path file naming this environment's site-packages (where tailguard is only an
    editable finder, which a path file's directory does not load)."""
    wheel, _ = built
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
         "--no-index", wheel], cwd=venv.parent)
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    cwd=venv.parent).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("TAILGUARD_")}
    return venv, env


def test_the_wheel_builds_without_a_setuptools_warning(built):
    _, output = built
    warnings = [line for line in output.splitlines()
                if "Warning" in line or "would be ignored" in line or "deprecated" in line]
    assert warnings == []


def test_the_wheel_holds_every_package_and_its_data(built):
    wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("tailguard/cli.py", "serving/engine/step_plugin.py", "slo/default_slo.yaml",
                   "dashboards/console/app.py", "dashboards/grafana/engine.json",
                   "dashboards/grafana/schema/dashboard.openapi.json",
                   *(f"dashboards/console/{page}" for page in CONSOLE_PAGES)):
        assert needed in names
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_installed_cli_answers_help_and_writes_rules(fresh, tmp_path):
    venv, env = fresh
    where = run([venv / "bin" / "python", "-c", "import tailguard; print(tailguard.__file__)"],
                cwd=tmp_path, env=env).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout
    helped = run([venv / "bin" / "tailguard", "--help"], cwd=tmp_path, env=env).stdout
    assert "serve" in helped and "rules" in helped
    run([venv / "bin" / "tailguard", "rules", "--out", tmp_path / "rules"], cwd=tmp_path,
        env=env)
    shipped = REPO / "alerts" / "generated"
    for name in ("tailguard-rules.yml", "tailguard-rules.test.yml"):
        assert (tmp_path / "rules" / name).read_text() == (shipped / name).read_text()


CONSOLE_SCRIPT = """
import sys, time
from pathlib import Path
import dashboards.console.app as app_module
from observe.tracelog import TraceLog
from streamlit.testing.v1 import AppTest
db = sys.argv[1]
now = time.time()
with TraceLog(db) as log:
    log.add("requests", {"request_id": "wheel-1", "arrival_ts": now - 60, "status": "ok",
                         "prompt_tokens": 20, "output_tokens": 4, "context_bucket": "0-1k",
                         "ttft_s": 0.05, "e2e_s": 0.4})
assert app_module.__file__.startswith(sys.prefix), app_module.__file__
app = AppTest.from_file(app_module.__file__, default_timeout=60)
app.run()
assert not app.exception, app.exception
for page in sys.argv[2:]:
    app.switch_page(page).run()
    assert not app.exception, (page, app.exception)
    print("page", page, "headers", [h.value for h in app.header])
"""


def test_the_installed_console_runs_every_page(fresh, tmp_path):
    venv, env = fresh
    env = {**env, "TAILGUARD_CONSOLE_DB": str(tmp_path / "trace.duckdb"),
           "TAILGUARD_CONSOLE_HOST": "127.0.0.1", "TAILGUARD_URL": "http://127.0.0.1:9"}
    done = run([venv / "bin" / "python", "-c", CONSOLE_SCRIPT, tmp_path / "trace.duckdb",
                *CONSOLE_PAGES], cwd=tmp_path, env=env)
    assert done.stdout.count("page views/") == len(CONSOLE_PAGES), done.stdout
