"""The processes behind an `AsyncLLM`: finding its engine core and workers, waiting
for them to go, naming them in logs."""

from __future__ import annotations

import logging
import time

import psutil

log = logging.getLogger("tailguard")


def engine_processes(engine) -> list:
    """The engine core processes of an `AsyncLLM` and their workers; empty for an
    engine without local processes."""
    core = getattr(engine, "engine_core", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    found = []
    for proc in getattr(manager, "processes", None) or ():
        try:
            root = psutil.Process(proc.pid)
            found += [root, *root.children(recursive=True)]
        except (psutil.Error, TypeError, ValueError):
            pass
    return found


def wait_gone(procs: list, timeout_s: float) -> list:
    """Wait until `procs` are gone (a zombie counts: its parent reaps it, and
    reaping it here would confuse `multiprocessing`); the ones still alive."""
    deadline = time.monotonic() + timeout_s
    procs = [p for p in procs if alive(p)]
    while procs and time.monotonic() < deadline:
        time.sleep(0.05)
        procs = [p for p in procs if alive(p)]
    return procs


def kill_all(procs: list, why: str) -> None:
    """SIGKILL each of `procs` (a stopped process dies too), logging each by name."""
    for proc in procs:
        try:
            proc.kill()
            log.warning("killed engine process %d (%s): %s", proc.pid, name_of(proc), why)
        except psutil.Error:
            pass


def alive(proc) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def name_of(proc) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "?"
