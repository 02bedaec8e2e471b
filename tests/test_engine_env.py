"""An engine core forked from the fork server starts with the server process's
environment as it is at that moment, as a spawned one would (not the fork server's,
frozen when the first engine started)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from serving.engine.setup import EnvCarryingContext

LATE = "TAILGUARD_TEST_LATE_VARIABLE"


def write_variable(path: str) -> None:
    with open(path, "w") as out:
        out.write(os.environ.get(LATE, "<unset>"))


def _seen_by_child(context, path) -> str:
    child = context.Process(target=write_variable, kwargs={"path": str(path)})
    child.start()
    child.join(60)
    assert child.exitcode == 0
    return path.read_text()


@pytest.fixture
def late_variable():
    os.environ.pop(LATE, None)
    yield
    os.environ.pop(LATE, None)


def test_a_variable_set_after_the_fork_server_started_reaches_the_child(tmp_path, late_variable):
    raw = multiprocessing.get_context("forkserver")
    carrying = EnvCarryingContext(raw)
    assert _seen_by_child(carrying, tmp_path / "first") == "<unset>"  # server starts here
    os.environ[LATE] = "set-later"
    # What the plain fork server gives: its own environment from when it started.
    assert _seen_by_child(raw, tmp_path / "raw") == "<unset>"
    assert _seen_by_child(carrying, tmp_path / "carried") == "set-later"


def test_a_variable_removed_later_is_gone_in_the_child(tmp_path, late_variable):
    carrying = EnvCarryingContext(multiprocessing.get_context("forkserver"))
    os.environ[LATE] = "early"
    assert _seen_by_child(carrying, tmp_path / "a") == "early"
    del os.environ[LATE]
    assert _seen_by_child(carrying, tmp_path / "b") == "<unset>"


def name_myself(path: str) -> None:
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")  # what vLLM's engine core does
    with open("/proc/self/comm") as comm, open(path, "w") as out:
        out.write(comm.read().strip())


def test_the_child_can_still_name_itself_after_its_environment_changed(tmp_path,
                                                                       late_variable):
    carrying = EnvCarryingContext(multiprocessing.get_context("forkserver"))
    os.environ[LATE] = "changed after the fork server started"
    child = carrying.Process(target=name_myself, kwargs={"path": str(tmp_path / "name")})
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert (tmp_path / "name").read_text() == "VLLM::EngineCor"  # comm keeps 15 bytes


def test_other_context_attributes_pass_through():
    raw = multiprocessing.get_context("forkserver")
    assert EnvCarryingContext(raw).get_start_method() == "forkserver"
