"""vLLM's own OpenAI server with tailguard's event-loop lag probe in its loop.

The issue-20 targets for the lag (p99 1 ms at light load, 5 ms at saturation) say
nothing of what vLLM's front end does to the same loop; this runs vLLM's server
(`vllm.entrypoints.openai.api_server`, arguments as given) with the very monitor
`tailguard serve` runs (`serving.guard.loop_lag.LoopLagMonitor`: a timer every 100 ms,
how late it fired) started on its loop, into a histogram of tailguard's bounds served
on vLLM's own `/metrics` as `PROBE_METRIC`. So `bench.serving.vs_vllm` reads both
servers' lag the same way.

    python -m bench.serving.vllm_lag_probe --model M --port P ...
"""

from __future__ import annotations

import runpy
import sys
from typing import Final

from observe import registry as R
from serving.guard.loop_lag import LoopLagMonitor

PROBE_METRIC: Final = "vllm_probe_event_loop_lag_seconds"


def probed_uvloop_run():
    """uvloop.run, with the lag monitor started first on the loop it runs."""
    import uvloop
    from prometheus_client import Histogram

    histogram = Histogram(PROBE_METRIC, R.EVENT_LOOP_LAG.description,
                          buckets=R.EVENT_LOOP_LAG.buckets)
    real_run = uvloop.run

    def run(main, **kwargs):
        async def with_probe():
            LoopLagMonitor(histogram.observe).start()
            return await main

        return real_run(with_probe(), **kwargs)

    return run


def main() -> None:
    import uvloop

    uvloop.run = probed_uvloop_run()  # vLLM's entry point looks it up when it starts
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__",
                     alter_sys=True)


if __name__ == "__main__":
    main()
