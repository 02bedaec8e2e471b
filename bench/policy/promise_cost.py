"""Benchmark: what the promise keeper (`slo.policy.promises.holds_back`) costs a call.

The limiter asks it whenever a request other than a VIP would enter the engine while
prompts due before it are there (on arrival, and again at each chunk while it waits at
the head of its lane). Each call plays the engine's next steps out twice, so its cost
grows with the prompts the engine holds. Timed on the live engine model's prior (the
embedded model on a 2-core CPU, 2,048-token steps, the 256-token adaptive cap), 10
decodes running, a 2,000-token newcomer due after `n` waiting or started prompts of
300-3,300 tokens; each size timed in `--rounds` rounds, the sizes alternating.

    python -m bench.policy.promise_cost --rounds 5 --calls 300
"""

from __future__ import annotations

import argparse
import statistics
import time

from serving.engine.live_model import PRIOR
from slo.policy import promises
from slo.policy.playout import Prompt
from slo.sim.lanes import LANE_PRIORITY_STEP

SIZES = (1, 4, 8, 16)


def scene(n: int) -> tuple[list[Prompt], Prompt]:
    """`n` prompts in the engine, every other one started, due 0.5 s on; a newcomer."""
    prompts = [Prompt(300 + 200 * i, 0, LANE_PRIORITY_STEP + i, i % 2 == 0, 0.5 + 0.1 * i)
               for i in range(n)]
    return prompts, Prompt(2000, 0, 2 * LANE_PRIORITY_STEP, False, 3.0)


def time_calls(n: int, calls: int) -> float:
    """Seconds of CPU a call, over `calls` calls."""
    model, (prompts, newcomer) = PRIOR.with_chunk_cap(256), scene(n)
    began = time.process_time()
    for _ in range(calls):
        promises.holds_back(model, 10, prompts, newcomer)
    return (time.process_time() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    runs: dict[int, list[float]] = {n: [] for n in SIZES}
    for rnd in range(args.rounds):
        order = SIZES if rnd % 2 == 0 else tuple(reversed(SIZES))
        for n in order:
            runs[n].append(time_calls(n, args.calls))
        print(f"round {rnd}: " + ", ".join(f"{n} prompts {runs[n][-1] * 1e6:.0f} us"
                                           for n in SIZES), flush=True)
    for n in SIZES:
        xs = runs[n]
        print(f"{n:>2} prompts in the engine: median {statistics.median(xs) * 1e6:.0f} us a "
              f"call (min {min(xs) * 1e6:.0f}, max {max(xs) * 1e6:.0f}); held back: "
              f"{promises.holds_back(PRIOR.with_chunk_cap(256), 10, *scene(n))}")


if __name__ == "__main__":
    main()
