"""The latency model fitted in a child process (`slo.predict.fit_process`): the same
model as a fit in process, at nice 19, and a failure that names itself."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from slo.predict.fit_process import NICE, FitFailed, fit_apart
from slo.predict.model import MIN_ROWS, train
from tests.test_predictor import synthetic


def test_a_fit_apart_is_the_fit_in_process():
    data = synthetic(600, seed=3)
    apart, here = fit_apart(data), train(data)
    assert (apart.rows, apart.window, apart.features) == (here.rows, here.window, here.features)
    X = synthetic(200, seed=4).X
    np.testing.assert_array_equal(apart.predict_many(X), here.predict_many(X))


def _children_nice(parent: int) -> dict[int, int]:
    """nice of each live child of `parent` running this module."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == parent and b"slo.predict.fit_process" in cmdline:
            out[int(stat.parent.name)] = int(fields[16])
    return out


def test_the_fit_runs_at_the_lowest_priority():
    seen: dict[int, int] = {}
    fit = threading.Thread(target=fit_apart, args=(synthetic(400),))
    fit.start()
    while fit.is_alive():
        seen.update(_children_nice(os.getpid()))
        if NICE in seen.values():
            break
        time.sleep(0.01)
    fit.join()
    assert NICE == 19 and list(seen.values())[-1:] == [19], seen


def test_a_failing_fit_names_its_error():
    with pytest.raises(FitFailed, match=f"need at least {MIN_ROWS} served requests"):
        fit_apart(synthetic(MIN_ROWS - 1))


def test_a_fit_past_its_time_is_stopped():
    started = time.monotonic()
    with pytest.raises(FitFailed, match="ran past 0.2 s"):
        fit_apart(synthetic(4000), timeout_s=0.2)
    assert time.monotonic() - started < 5
    time.sleep(0.1)
    assert _children_nice(os.getpid()) == {}  # killed, not left running


def test_a_fit_killed_midway_is_a_failed_fit():
    """An operator's `kill -9` (or the OOM killer) on the child: the retrain fails with
    the reason, nothing hangs."""
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            fit_apart(synthetic(4000))
        except FitFailed as exc:
            failure.append(exc)

    thread = threading.Thread(target=fit)
    thread.start()
    deadline = time.monotonic() + 30
    while not (children := _children_nice(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.01)
    for pid in children:
        os.kill(pid, 9)
    thread.join(30)
    assert children and not thread.is_alive()
    assert len(failure) == 1 and "the fitting process exited with -9" in str(failure[0])


def test_an_answer_that_is_not_a_model_is_a_failed_fit(tmp_path, monkeypatch):
    impostor = tmp_path / "python"
    impostor.write_text("#!/bin/sh\ncat > /dev/null\necho 'not a pickle'\n")
    impostor.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(impostor))
    with pytest.raises(FitFailed, match="answer is not a model"):
        fit_apart(synthetic(MIN_ROWS))
