"""Fitting the latency model in a process of its own, at the lowest CPU priority.

A fit of the four quantile models takes about 6 s of a core on a 2-vCPU machine. In
the server's process it held the GIL against the event loop and took its core from the
engine at full priority: TTFT p99 rose from about 0.32 s to 0.38-0.48 s in the
saturated batches that held one. In a child at nice 19 the fit takes only the CPU
that serving leaves (the server process waits on a pipe), and those batches kept
0.29-0.37 s; the fit takes 2-7.5x as long and 1.4 s more CPU, its import of
scikit-learn (docs/benchmarks.md, "The fit in a process of its own"). The training set
goes in on stdin and the fitted model comes back on stdout, both pickled: the child is
always this module, run by the same interpreter from the same packages, never anything
that reads outside data.

    python -m slo.predict.fit_process < training-set.pickle > model.pickle
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Final

from observe import settings
from slo.predict.features import TrainingSet
from slo.predict.model import LatencyModel, train

NICE: Final = 19  # the lowest priority: the fit runs on what serving leaves
DEFAULT_TIMEOUT_S: Final = 600.0
PACKAGES_ROOT: Final = Path(__file__).resolve().parents[2]  # where `slo` is imported from


class FitFailed(RuntimeError):
    """The fitting process exited without a model (its error is in the message)."""


def fit_apart(data: TrainingSet, timeout_s: float = DEFAULT_TIMEOUT_S) -> LatencyModel:
    """`train(data)` in a child process at nice 19 on one thread; the fitted model.
    FitFailed when the child fails, is killed or runs past `timeout_s` (then killed)."""
    env = settings.child_environ({settings.PYTHONPATH: os.pathsep.join(
        filter(None, (str(PACKAGES_ROOT), settings.get(settings.PYTHONPATH))))})
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=pickle.dumps(data),
                              capture_output=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FitFailed(f"the fit ran past {timeout_s:g} s and was stopped") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise FitFailed(f"the fitting process exited with {done.returncode}: {tail[0]}")
    try:
        model = pickle.loads(done.stdout)
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise FitFailed(f"the fitting process's answer is not a model: {exc}") from exc
    if not isinstance(model, LatencyModel):
        raise FitFailed(f"the fitting process returned a {type(model).__name__}")
    return model


def main() -> None:
    from threadpoolctl import threadpool_limits

    os.nice(NICE)
    data = pickle.load(sys.stdin.buffer)
    out, sys.stdout = sys.stdout.buffer, sys.stderr  # nothing else may reach the pipe
    with threadpool_limits(1):  # one core at most, whatever the machine has
        model = train(data)
    pickle.dump(model, out)
    out.flush()


if __name__ == "__main__":
    main()
