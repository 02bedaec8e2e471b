"""One worker process of the overhead benchmark: it starts the three engines in its
rotated order, runs the warm-up round and its measured rounds over the four sides, and
writes what it measured (rounds, diagnostics, trace-log stats) as JSON. The
orchestrator (`bench.serving.overhead`) starts each worker in a fresh interpreter."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.serving.overhead_sides import (
    SIDES,
    batch_bare,
    batch_observed,
    make_prompts,
    side_turn,
)
from observe.settings import TAILGUARD_STEP_SOCKET as ENV_STEP_SOCKET  # set: the probe runs

ORDERS = (("off", "on", "bare", "observed"), ("observed", "bare", "on", "off"),
          ("bare", "observed", "off", "on"), ("on", "off", "observed", "bare"))
ENGINES = ("off", "on", "runtime")
SETTLE_S = 1.2  # pause after each side-turn: the trace log's 1 s flush lands in it
PINNED_LIMIT = 64  # >= the concurrency, so the limiter never holds a request back
# ... and the deadline check's verdict off (its estimate is still made for every
# request): a batch of 32 arriving at once is late for a 200 ms target by design here
PINNED_LIMIT_YAML = (f"batch_floor: {PINNED_LIMIT}\nbatch_initial: {PINNED_LIMIT}\n"
                     f"batch_cap: {PINNED_LIMIT}\ndeadline_check: false\n")
LOG_PREFIX = "[overhead] "  # the orchestrator relays the lines that carry it


class Cpu:
    """Accumulates the calling thread's CPU time spent in wrapped callables."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - t
                self.calls += 1
        return timed

    def take(self) -> tuple[float, int]:
        out = self.seconds, self.calls
        self.seconds, self.calls = 0.0, 0
        return out


class CpuMeter:
    """Between `start()` and `stop()`: CPU that processes outside this benchmark took
    (other tenants of the box, plus hypervisor steal), in cores, and the CPU seconds
    of this (the server-side) process, all its threads."""

    def __init__(self):
        import psutil

        self._me = psutil.Process()
        self._tick = os.sysconf("SC_CLK_TCK")

    def _busy(self) -> float:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = f
        return (user + nice + system + irq + softirq + steal) / self._tick

    def _own(self) -> tuple[float, float]:
        """(this process, this process and all its descendants)."""
        t = self._me.cpu_times()
        mine = t.user + t.system
        total = mine
        for p in self._me.children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except Exception:  # a helper process that just exited
                pass
        return mine, total

    def start(self) -> None:
        self._t, self._b, self._o = time.monotonic(), self._busy(), self._own()

    def stop(self) -> dict:
        wall = time.monotonic() - self._t
        mine, total = self._own()
        foreign = (self._busy() - self._b) - (total - self._o[1])
        return {"foreign": max(0.0, foreign) / wall, "server_cpu_s": mine - self._o[0]}


async def worker(args, out_path: Path, proc_index: int) -> None:
    from vllm import SamplingParams

    from serving.config import ServerConfig
    from serving.engine.embedded_model import ensure_model
    from serving.engine.setup import start_engine, vllm_namespace
    from serving.engine.step_receiver import StepLedger
    from serving.runtime import Runtime

    model = ensure_model()
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0)
    tmp = tempfile.TemporaryDirectory(prefix="tailguard-bench-")
    # The concurrency limit pinned above the batch: this measures what observing costs,
    # not what the batch-size controller does (it starts at 16 and would hold half of
    # the 32 requests back; bench.policy.surge and bench.serving.vs_vllm measure that).
    limits = Path(tmp.name) / "pinned-limit.yaml"
    limits.write_text(PINNED_LIMIT_YAML)
    runtime = Runtime(ServerConfig(model=str(model), db=str(Path(tmp.name) / "trace.duckdb"),
                                   policy_file=str(limits)))
    ledger = StepLedger()  # receives the "on" engine's steps; no consumers
    plain: dict[str, object] = {}
    cpu = {name: Cpu() for name in ("begin", "finish", "steps", "flush")}
    # diagnostics: CPU time in the runtime's step consumers (ledger thread) and
    # trace-log flushes (writer thread); wraps instance attributes only
    runtime.ledger._consumers = [cpu["steps"].wrap(c) for c in runtime.ledger._consumers]
    runtime.tracelog.flush = cpu["flush"].wrap(runtime.tracelog.flush)

    async def start(which: str) -> None:
        t = time.monotonic()
        os.environ.pop(ENV_STEP_SOCKET, None)
        if which == "runtime":
            await runtime.start()  # its ledger exports the variable for its engine core
        else:
            if which == "on" and not args.control:
                ledger.start()
            plain[which] = start_engine(vllm_namespace(str(model), None, []), [])
            await plain[which].get_supported_tasks()
        os.environ.pop(ENV_STEP_SOCKET, None)
        log(f"proc {proc_index}: engine '{which}' up in {time.monotonic() - t:.1f}s")

    # start order rotates with the process index: engines started earlier in a process
    # run slower (see the module docstring), so every side takes every slot once per
    # three processes
    starts = ENGINES[proc_index % 3:] + ENGINES[:proc_index % 3]
    batch_counter = iter(range(10**9))

    def next_prompts():
        return make_prompts(args, next(batch_counter), vocab)

    runners = {
        "off": lambda p: batch_bare(plain["off"], p, params),
        "on": lambda p: batch_bare(plain["on"], p, params),
        "bare": lambda p: batch_bare(runtime.handle.engine._engine, p, params),
        "observed": lambda p: batch_observed(runtime, p, params, cpu),
    }
    meter = CpuMeter()
    rounds, limit_min = [], PINNED_LIMIT
    diag = {"steps_on": 0, "steps_off": 0, "observed_requests": 0, "observed_steps": 0,
            **{f"{k}_cpu_s": 0.0 for k in cpu}, "flushes": 0}
    try:
        for which in starts:
            await start(which)
        for r in range(args.rounds_per_proc + 1):  # round 0 is the warm-up
            order = ORDERS[0] if r == 0 else ORDERS[(r - 1 + proc_index) % 4]
            result = {"proc": proc_index, "round": r, "order": order}
            for side in order:
                ledger.drain()
                probe_before, steps_before = ledger.steps_seen, runtime.ledger.steps_seen
                for c in cpu.values():
                    c.take()
                meter.start()
                result[side] = await side_turn(runners[side], next_prompts, args.batches)
                result[side].update(meter.stop())
                result[side]["server_ms_per_req"] = (
                    1e3 * result[side]["server_cpu_s"] / result[side]["requests"])
                await asyncio.sleep(SETTLE_S)
                ledger.drain()
                if r == 0:
                    continue
                if side in ("on", "off"):
                    diag[f"steps_{side}"] += ledger.steps_seen - probe_before
                if side == "observed":
                    limit_min = min(limit_min, runtime.guard.limiter.limit)
                    diag["observed_requests"] += result[side]["requests"]
                    diag["observed_steps"] += runtime.ledger.steps_seen - steps_before
                    for name, c in cpu.items():
                        seconds, calls = c.take()
                        diag[f"{name}_cpu_s"] += seconds
                        if name == "flush":
                            diag["flushes"] += calls
            log(f"proc {proc_index} round {r}{' (warm-up)' if r == 0 else ''}: "
                + ", ".join(f"{s} {result[s]['tok_s']:.0f}" for s in SIDES) + " tok/s; "
                f"foreign load {max(result[s]['foreign'] for s in SIDES):.2f} cores")
            rounds.append(result)
        tracelog = runtime.tracelog.stats()
    finally:
        for engine in plain.values():
            engine.shutdown()
        ledger.close()
        await runtime.stop()
        tmp.cleanup()
    out_path.write_text(json.dumps({"rounds": rounds, "diag": diag, "tracelog": tracelog,
                                    "limit_min": limit_min,
                                    "start_order": starts},
                                   default=str))


def log(msg: str) -> None:
    print(f"{LOG_PREFIX}{msg}", file=sys.stderr, flush=True)
