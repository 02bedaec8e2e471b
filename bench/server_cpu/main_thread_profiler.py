"""Run a server module with cProfile on its main thread (the event loop's), from
SIGUSR1 to SIGUSR2, the stats written to `$PROFILE_OUT` at SIGUSR2. Used by
`bench/server_cpu/call_profile.py`:

    PROFILE_OUT=x.prof python bench/server_cpu/main_thread_profiler.py MODULE ARGS...

cProfile follows only the thread that enables it, and a signal handler runs on the
main thread: the asyncio loop's, where the per-request work of both servers runs.
"""

import cProfile
import os
import runpy
import signal
import sys

profile = cProfile.Profile()


def _stop(*_) -> None:
    profile.disable()
    profile.dump_stats(os.environ["PROFILE_OUT"])


if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
    signal.signal(signal.SIGUSR2, _stop)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
