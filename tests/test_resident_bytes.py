"""The server's RSS with its children (the engine core): children found once and kept,
found again when one exits."""

from __future__ import annotations

import subprocess
import sys

import psutil

from serving.engine.load import ResidentBytes


def test_children_count_and_an_exited_one_is_dropped():
    own = psutil.Process().memory_info().rss
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        psutil.Process(child.pid).memory_info()  # started
        rss = ResidentBytes(refresh_s=3600)
        with_child = rss()
        assert with_child >= own + psutil.Process(child.pid).memory_info().rss * 0.5
    finally:
        child.kill()
        child.wait()
    first = rss()  # reads the exited child, fails for it, and finds the children anew
    assert first is not None and rss() < with_child
