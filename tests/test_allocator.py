"""The engine's allocator: `serve` re-executes itself with tcmalloc preloaded, and the
engine starts without oneDNN's global primitive cache (serving/engine/allocator.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from observe.settings import TAILGUARD_TCMALLOC as ENV_TCMALLOC
from serving.engine.allocator import (
    find_tcmalloc,
    freeze_heap,
    preload_env,
    set_engine_env_defaults,
    thaw_heap,
)

LIB = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"

CASES = [
    # (environment, library found, expected LD_PRELOAD after; None = no re-exec)
    ({}, LIB, LIB),
    ({"LD_PRELOAD": "/opt/libiomp5.so"}, LIB, f"{LIB}:/opt/libiomp5.so"),
    ({}, None, None),
    ({"LD_PRELOAD": "/other/libtcmalloc.so.4"}, LIB, None),  # already there: no loop
    ({"LD_PRELOAD": LIB}, LIB, None),
    ({ENV_TCMALLOC: "0"}, LIB, None),
    ({ENV_TCMALLOC: "off"}, LIB, None),
    ({ENV_TCMALLOC: " False "}, LIB, None),
    ({ENV_TCMALLOC: "1"}, LIB, LIB),
]


@pytest.mark.parametrize(("environ", "library", "expected"), CASES)
def test_preload_env(environ, library, expected):
    env = preload_env({"PATH": "/bin", **environ}, library)
    if expected is None:
        assert env is None
    else:
        assert env["LD_PRELOAD"] == expected
        assert env["PATH"] == "/bin"  # the rest of the environment is kept


def test_debian_package_is_found():
    # scripts/system-deps.sh installs libtcmalloc-minimal4 (CI runs it before the tests)
    found = find_tcmalloc()
    assert found is not None and Path(found).name == "libtcmalloc_minimal.so.4"


def test_engine_env_defaults_yield_to_the_operator(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    set_engine_env_defaults()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "0"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
    set_engine_env_defaults()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "256"


def _maps(process: psutil.Process) -> str:
    return Path(f"/proc/{process.pid}/maps").read_text()


def test_server_and_engine_processes_run_on_tcmalloc(server):
    root = psutil.Process(server.process.pid)  # same pid after the re-exec
    assert root.cmdline()[1:4] == ["-m", "tailguard", "serve"]
    tree = [root, *root.children(recursive=True)]
    engines = [p for p in tree if p.name().startswith("VLLM::")]
    assert engines, [p.name() for p in tree]
    for process in [root, *engines]:
        assert "libtcmalloc_minimal.so.4" in _maps(process), process.name()


def test_serve_reexecutes_itself_unless_switched_off(tmp_path):
    # The probe runs `serve --help` through the CLI's real entry point. If the CLI
    # re-executes itself, the new process prints the usage and the probe's exit hook
    # is gone with the old one; switched off, the hook prints the untouched LD_PRELOAD.
    probe = ("import atexit, os, sys; sys.argv = ['tailguard', 'serve', '--help'];"
             "atexit.register(lambda: print('LD=' + os.environ.get('LD_PRELOAD', '')));"
             "from tailguard.cli import main; main()")
    root = Path(__file__).resolve().parents[1]
    for flag, reexec in (("0", False), ("1", True)):
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), ENV_TCMALLOC: flag}
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, timeout=120, cwd=root)
        assert out.returncode == 0 and "Usage:" in out.stdout, out.stderr[-2000:]
        assert ("LD=" in out.stdout) is not reexec, (flag, out.stdout[-500:])
        if not reexec:
            assert "LD=\n" in out.stdout  # nothing was preloaded


def test_a_frozen_heap_is_out_of_the_collectors_scans_until_thawed():
    """What a full collection would walk (the objects of its generations): the objects
    alive at the freeze are not among them, a cycle made after it is still collected,
    and after the thaw they are back, so an engine shut down can be collected."""
    kept = [[i] for i in range(10_000)]  # lists stay tracked (a dict of ints may not)
    try:
        frozen = freeze_heap()
        assert frozen >= len(kept) and gc.get_freeze_count() == frozen
        scanned = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in scanned for o in kept)
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # garbage made after the freeze is collected as ever
    finally:
        thaw_heap()
    assert gc.get_freeze_count() == 0
    scanned = {id(o) for o in gc.get_objects()}
    assert all(id(o) in scanned for o in kept)
