"""The install scripts as a new user meets them: one line per step with its time on the
terminal, every byte of pip's and apt's output in the log file, the log's end shown
when a step fails; `system-deps.sh --serve` says in one line that tcmalloc is missing
(not root, or apt cannot install it) and goes on, while the test dependencies' failed
install stops `make test`. apt, dpkg and id are stubs on PATH: nothing is installed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"^  (?P<what>.+?) +(?P<took>\d+)s  \(total \d+s\)$")


def bash(script: str, log: Path, path_prefix: Path | None = None,
         args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, INSTALL_LOG=str(log))
    env.pop("_PROGRESS_T0", None)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}:{env['PATH']}"
    return subprocess.run(["bash", "-c", script, "bash", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def stubs(tmp_path: Path, **scripts: str) -> Path:
    """Executables named by the keywords (`apt_get` for apt-get), each a shell body."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        exe = bin_dir / name.replace("_", "-")
        exe.write_text(f"#!/bin/sh\n{body}\n")
        exe.chmod(0o755)
    return bin_dir


def test_a_step_prints_one_line_with_its_time_and_logs_everything(tmp_path):
    log = tmp_path / "install.log"
    done = bash("""source scripts/progress.sh
step "noisy thing" sh -c 'for i in 1 2 3; do echo out $i; echo err $i >&2; done'
step "quiet thing" true""", log)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert [STEP_LINE.match(line)["what"] for line in lines] == ["noisy thing", "quiet thing"]
    text = log.read_text()
    for n in (1, 2, 3):
        assert f"out {n}\n" in text and f"err {n}\n" in text
    assert re.search(r"^=== \S+Z noisy thing: sh -c ", text, re.M)


def test_a_failed_step_shows_the_end_of_the_log_and_stops_with_its_exit_code(tmp_path):
    log = tmp_path / "install.log"
    done = bash("""source scripts/progress.sh
step "breaks" sh -c 'for i in $(seq 1 40); do echo line $i; done; exit 3'
step "never runs" true""", log)
    assert done.returncode == 3
    assert re.search(r"breaks +FAILED after \d+s \(exit 3\); the end of .*install\.log:",
                     done.stderr)
    assert "line 40" in done.stderr and "line 11\n" in done.stderr  # the last 30 lines
    assert "line 10\n" not in done.stderr
    assert "never runs" not in done.stderr
    assert "line 1\n" in log.read_text()  # the whole output stays in the log


def test_serve_without_root_says_in_one_line_that_tcmalloc_is_missing(tmp_path):
    bin_dir = stubs(tmp_path, dpkg="exit 1", id='[ "$1" = -u ] && echo 1000 || echo user',
                    apt_get="echo apt-get must not run >&2; exit 100")
    done = bash('exec bash scripts/system-deps.sh "$@"', tmp_path / "install.log",
                bin_dir, ("--serve",))
    assert done.returncode == 0, done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("  tcmalloc missing (apt-get install libtcmalloc-minimal4")
    assert "must not run" not in done.stderr


def test_serve_as_root_with_apt_failing_says_so_and_goes_on(tmp_path):
    bin_dir = stubs(tmp_path, dpkg="exit 1", id='[ "$1" = -u ] && echo 0 || echo root',
                    apt_get="echo 'E: no mirror reachable'; exit 100")
    log = tmp_path / "install.log"
    done = bash('exec bash scripts/system-deps.sh "$@"', log, bin_dir, ("--serve",))
    assert done.returncode == 0, done.stderr
    assert "apt package lists" in done.stderr and "FAILED" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith("  tcmalloc missing")
    assert "E: no mirror reachable" in log.read_text()


def test_the_test_dependencies_failing_to_install_stop_make_test(tmp_path):
    bin_dir = stubs(tmp_path, dpkg="exit 1", id='[ "$1" = -u ] && echo 0 || echo root',
                    apt_get="echo 'E: no mirror reachable'; exit 100")
    done = bash("exec bash scripts/system-deps.sh", tmp_path / "install.log", bin_dir)
    assert done.returncode == 100
    assert "apt package lists" in done.stderr and "E: no mirror reachable" in done.stderr
    assert "tcmalloc missing" not in done.stderr


def test_nothing_runs_when_every_package_is_there(tmp_path):
    bin_dir = stubs(tmp_path, dpkg="exit 0", apt_get="echo apt-get ran >&2; exit 100")
    for args in ((), ("--serve",)):
        done = bash('exec bash scripts/system-deps.sh "$@"', tmp_path / "install.log",
                    bin_dir, args)
        assert (done.returncode, done.stderr) == (0, "")
