"""What tailguard's observation costs vLLM: generated tokens/s and TTFT, with and without.

Every comparison alternates its sides within one process (this machine is noisy, so
only interleaved comparisons mean anything). Each worker process holds three engines
at once and takes turns on them (an idle vLLM worker busy-polls for 1 s after its last
step, then sleeps; the pause after each turn covers that). Engines started earlier in
a process run slower than later ones (10-20% in --control runs, whichever side they
serve; cause not found), so the worker processes rotate the start order and every side
gets every start slot once per three processes; the per-process ratios are printed too:

  off       plain `AsyncLLM` as `vllm serve` builds it, engine core spawned without
            `TAILGUARD_STEP_SOCKET` (the step plugin is inert); bare `generate()` calls;
  on        the same, engine core spawned with the variable set: the step probe runs in
            the engine and a bare `StepLedger` receives its datagrams;
  bare      a full tailguard `Runtime` (step probe + its ledger and step consumers, stat
            logger, 1 s engine-stats ticker, trace log on a real DuckDB file in a temp
            dir) driven with bare `AsyncLLM.generate()` calls on its engine;
  observed  the same Runtime through what the HTTP layer does, minus HTTP:
            `observer.begin()`, `current_request` set, `ObservedEngine.generate()`,
            `rec.model`, `observer.finish()` (spans, metrics, SLO verdict, trace row).

Ratios reported: observed/bare (the per-request observation path, same engine),
on/off (the in-engine step probe), bare/off and observed/off (everything tailguard adds
to a plain vLLM engine; the last one is the end-to-end answer).

Rounds: one warm-up round (discarded), then measured rounds. A round runs the four
sides in one of four orders that put every side in every position once per four
rounds; consecutive rounds alternate which of off/on and of bare/observed goes first
(odd rounds off and bare first in process 0); process k starts its cycle of orders k
rounds later. Each side-turn is --batches back-to-back batches, then a 1.2 s pause
(the trace log flushes every 1 s: its last flush lands in that pause).

Noise: for every turn the CPU that other processes took (system busy time from
/proc/stat minus this benchmark's process tree, in cores) is recorded; ratios are also
reported over the "quiet" rounds only (--quiet). --control is an A/A run: the "on"
engine starts without the probe as well, so on/off shows the engine-to-engine bias and
the noise floor that the probe's ratio has to be read against.

Workload: fixed seed, N requests submitted together, prompt lengths uniform in
[--prompt-min, --prompt-max] tokens (the same lengths every batch; fresh random token
ids every batch, so the prefix cache never hits), M output tokens, ignore_eos, greedy.
tokens/s = generated tokens / wall time of the side-turn's batches; TTFT = time from the
batch's submit to the request's first output carrying tokens.

    python bench/overhead.py               # full run, about 7 minutes on 2 cores
    python bench/overhead.py --control     # the same with the probe off in "on" too
    python bench/overhead.py --quick       # smoke run, about 2 minutes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIDES = ("off", "on", "bare", "observed")
ORDERS = (("off", "on", "bare", "observed"), ("observed", "bare", "on", "off"),
          ("bare", "observed", "off", "on"), ("on", "off", "observed", "bare"))
ENGINES = ("off", "on", "runtime")
SETTLE_S = 1.2  # pause after each side-turn: the trace log's 1 s flush lands in it
FIRST_TOKEN_ID = 3  # skip the special tokens at the start of the embedded vocab
ENV_STEP_SOCKET = "TAILGUARD_STEP_SOCKET"  # serving.engine.step_plugin.ENV_STEP_SOCKET
PINNED_LIMIT = 64  # >= the concurrency, so the limiter never holds a request back
PINNED_LIMIT_YAML = (f"batch_floor: {PINNED_LIMIT}\nbatch_initial: {PINNED_LIMIT}\n"
                     f"batch_cap: {PINNED_LIMIT}\n")


# ---------------------------------------------------------------- workload

def prompt_lengths(args) -> list[int]:
    rng = random.Random(args.seed)
    return [rng.randint(args.prompt_min, args.prompt_max) for _ in range(args.concurrency)]


def make_prompts(args, batch_index: int, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed * 1_000_003 + batch_index)
    return [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]
            for n in prompt_lengths(args)]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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


async def _generate(engine, prompt, params, request_id: str) -> tuple[float | None, int]:
    """One request, the same loop on both sides: (first-token time, output tokens)."""
    first, n = None, 0
    async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id):
        n = len(out.outputs[0].token_ids)
        if n and first is None:
            first = time.monotonic()
    return first, n


async def batch_bare(engine, prompts, params) -> dict:
    """N concurrent bare `AsyncLLM.generate()` calls."""
    t0 = time.monotonic()

    async def one(prompt) -> tuple[float, int]:
        first, n = await _generate(engine, prompt, params, f"cmpl-{uuid.uuid4().hex}-0")
        return first - t0, n

    results = await asyncio.gather(*(one(p) for p in prompts))
    return {"wall_s": time.monotonic() - t0, "ttfts": [r[0] for r in results],
            "tokens": sum(r[1] for r in results)}


async def batch_observed(runtime, prompts, params, cpu: dict) -> dict:
    """The same calls through the full observation path (what serving/generation.py
    does around vLLM's serving handler, minus HTTP and vLLM's OpenAI layer)."""
    from serving.engine.observed import current_request

    begin, finish = cpu["begin"].wrap(runtime.observer.begin), \
        cpu["finish"].wrap(runtime.observer.finish)
    engine, model_name = runtime.handle.engine, runtime.config.model_name
    t0 = time.monotonic()

    async def one(prompt) -> tuple:
        rec, span = begin("text_completion", {})
        current_request.set(rec)  # each gather() task runs in its own context copy
        rec.model = model_name
        first, n = await _generate(engine, prompt, params, f"cmpl-{rec.request_id}-0")
        finish(rec, span)
        # every generated token needs a step: fewer credited steps = lost datagrams
        return first - t0, n, rec.status != "ok", rec.tally.steps >= n

    results = await asyncio.gather(*(one(p) for p in prompts))
    return {"wall_s": time.monotonic() - t0, "ttfts": [r[0] for r in results],
            "tokens": sum(r[1] for r in results), "not_ok": sum(r[2] for r in results),
            "probe_credited": sum(r[3] for r in results)}


async def side_turn(run, make_prompts_fn, batches: int) -> dict:
    """`batches` back-to-back batches -> tokens/s over their summed wall time and TTFT
    percentiles over all their requests."""
    parts = [await run(make_prompts_fn()) for _ in range(batches)]
    wall = sum(p["wall_s"] for p in parts)
    ttfts = [t for p in parts for t in p["ttfts"]]
    tokens = sum(p["tokens"] for p in parts)
    out = {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall, "requests": len(ttfts),
           "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99)}
    for key in ("not_ok", "probe_credited"):
        if key in parts[0]:
            out[key] = sum(p[key] for p in parts)
    return out


# ---------------------------------------------------------------- worker (subprocess)

async def worker(args, out_path: Path, proc_index: int) -> None:
    from vllm import SamplingParams

    from serving.config import ServerConfig
    from serving.engine.setup import start_engine, vllm_namespace
    from serving.engine.embedded_model import ensure_model
    from serving.runtime import Runtime
    from serving.engine.step_receiver import StepLedger

    model = ensure_model()
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0)
    tmp = tempfile.TemporaryDirectory(prefix="tailguard-bench-")
    # The concurrency limit pinned above the batch: this measures what observing costs,
    # not what the batch-size controller does (it starts at 16 and would hold half of
    # the 32 requests back; bench/policy_surge.py and bench/vs_vllm.py measure that).
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
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- orchestration

def spawn(args, tmp: Path, proc_index: int) -> dict:
    """Run one worker in a fresh interpreter; vLLM's logs go to a file."""
    out, logfile = tmp / f"worker-{proc_index}.json", tmp / f"worker-{proc_index}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(proc_index),
           "--out", str(out), *args.passthrough]
    env = {k: v for k, v in os.environ.items() if k != ENV_STEP_SOCKET}
    with logfile.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        seen = 0
        while proc.poll() is None:  # relay progress lines as they come
            time.sleep(1)
            seen = relay(logfile, seen)
        relay(logfile, seen)
    if proc.returncode != 0 or not out.exists():
        tail = logfile.read_text(errors="replace")[-5000:]
        sys.exit(f"worker {proc_index} failed (rc {proc.returncode}); log tail:\n{tail}")
    return json.loads(out.read_text())


def relay(logfile: Path, seen: int) -> int:
    lines = logfile.read_text(errors="replace").splitlines()
    for line in lines[seen:]:
        if line.startswith("[overhead] "):
            print("   ", line[len("[overhead] "):], flush=True)
    return len(lines)


def spread(values: list[float], fmt: str) -> str:
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def table(rounds: list[dict], a: str, b: str) -> list[str]:
    """metric | side a | side b | ratio b/a per round: median [min-max]."""
    med = lambda side, key: statistics.median(r[side][key] for r in rounds)  # noqa: E731
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    lines = [f"| metric | {a} | {b} | {b}/{a} per round: median [min-max] |",
             "|---|---:|---:|---:|"]
    for key, label, fmt, rfmt in (
            ("tok_s", "generated tokens/s", lambda v: f"{v:.0f}", "{:.4f}"),
            ("ttft_p50", "TTFT p50", ms, "{:.3f}"),
            ("ttft_p99", "TTFT p99", ms, "{:.3f}"),
            ("server_ms_per_req", "server-process CPU per request", lambda v: f"{v:.2f} ms",
             "{:.3f}")):
        ratios = [r[b][key] / r[a][key] for r in rounds]
        lines.append(f"| {label} | {fmt(med(a, key))} | {fmt(med(b, key))} | "
                     f"{spread(ratios, rfmt)} |")
    return lines


def report(args, command: str, results: list[dict], elapsed: float) -> None:
    rounds = [r for res in results for r in res["rounds"] if r["round"] > 0]
    tok = lambda b, a: [r[b]["tok_s"] / r[a]["tok_s"] for r in rounds]  # noqa: E731
    print()
    print(f"### tailguard overhead: {args.concurrency} concurrent requests, prompts "
          f"{args.prompt_min}-{args.prompt_max} tokens, {args.max_tokens} output tokens "
          f"(ignore_eos, greedy), {args.batches} batches per side-turn; {len(rounds)} "
          f"measured rounds over {len(results)} process(es). Values: median over rounds; "
          "ratios: per round, median [min-max].")
    for title, a, b in (
            ("1. Observation path on one Runtime engine (bare generate vs observed)",
             "bare", "observed"),
            ("2. Step probe in the engine (plain engines, probe off vs on)"
             + (" -- CONTROL RUN: 'on' has NO probe" if args.control else ""), "off", "on"),
            ("3. End to end: plain vLLM engine vs tailguard Runtime, observed",
             "off", "observed")):
        print()
        print(title)
        print()
        print("\n".join(table(rounds, a, b)))
    quiet = [r for r in rounds if max(r[s]["foreign"] for s in SIDES) < args.quiet]
    print()
    print("per-round tokens/s ratios (and the most CPU other processes took during any "
          "turn of the round, in cores of 2):")
    for b, a in (("observed", "bare"), ("on", "off"), ("bare", "off"), ("observed", "off")):
        print(f"  {b + '/' + a:13s} " + " ".join(f"{x:.3f}" for x in tok(b, a)))
    print(f"  {'foreign load':13s} "
          + " ".join(f"{max(r[s]['foreign'] for s in SIDES):.3f}" for r in rounds))
    print("per-process medians of the tokens/s ratios (engines started in the order shown):")
    for res in results:
        rs = [r for r in res["rounds"] if r["round"] > 0]
        start = " > ".join(res["start_order"])
        print(f"  proc {rs[0]['proc']} ({start}): " + ", ".join(
            f"{b}/{a} {statistics.median(r[b]['tok_s'] / r[a]['tok_s'] for r in rs):.3f}"
            for b, a in (("observed", "bare"), ("on", "off"), ("bare", "off"),
                         ("observed", "off"))))
    print()
    print(f"tokens/s ratios, all rounds vs quiet rounds (other processes under "
          f"{args.quiet} cores in every turn):")
    print()
    print(f"| ratio | all rounds (n={len(rounds)}) | quiet rounds (n={len(quiet)}) |")
    print("|---|---:|---:|")
    for b, a in (("observed", "bare"), ("on", "off"), ("bare", "off"), ("observed", "off")):
        q = spread([r[b]["tok_s"] / r[a]["tok_s"] for r in quiet], "{:.4f}") if quiet else "-"
        print(f"| {b}/{a} | {spread(tok(b, a), '{:.4f}')} | {q} |")
    print()
    d = {k: sum(res["diag"][k] for res in results) for k in results[0]["diag"]}
    n = max(d["observed_requests"], 1)
    print("CPU time per observed request (thread CPU, during observed side-turns): "
          f"observer.begin {1e6 * d['begin_cpu_s'] / n:.0f} us, "
          f"observer.finish {1e6 * d['finish_cpu_s'] / n:.0f} us (event loop); "
          f"step consumers {1e6 * d['steps_cpu_s'] / n:.0f} us "
          f"({1e6 * d['steps_cpu_s'] / max(d['observed_steps'], 1):.0f} us/step, ledger "
          f"thread); trace-log flush {1e6 * d['flush_cpu_s'] / n:.0f} us (writer thread, "
          f"{d['flushes']} flushes, incl. the one in the pause after each turn)")
    tl = [res["tracelog"] for res in results]
    sides = [r["observed"] for r in rounds]
    print(f"checks: observed requests not ok {sum(s['not_ok'] for s in sides)}; credited "
          f"with a probe step for every token {sum(s['probe_credited'] for s in sides)}/{n}; "
          f"trace-log "
          f"requests rows {sum(t['rows_written']['requests'] for t in tl)} (incl. warm-up), "
          f"rows dropped {sum(sum(t['rows_dropped'].values()) for t in tl)}; probe steps "
          f"received in on-turns {d['steps_on']}, in off-turns {d['steps_off']}; "
          f"observed-side concurrency limit, lowest seen "
          f"{min(res['limit_min'] for res in results)} (pinned at {PINNED_LIMIT})")
    print(f"elapsed {elapsed:.0f} s")
    print()
    print(f"reproduce: {command}")


def main_bench(args) -> int:
    command = "python bench/overhead.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"== {args.procs} process(es) x ({args.rounds_per_proc} rounds + 1 warm-up) x "
          f"4 sides x {args.batches} batches of {args.concurrency} x {args.max_tokens} tokens",
          flush=True)
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tailguard-overhead-") as tmp:
        results = [spawn(args, Path(tmp), p) for p in range(args.procs)]
    report(args, command, results, time.monotonic() - t)
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9,
                    help="measured rounds in all, split over --procs (9)")
    ap.add_argument("--procs", type=int, default=3,
                    help="worker processes, each starting its three engines afresh in a "
                         "rotated order; use a multiple of 3 (3)")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent requests (32)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens each (64)")
    ap.add_argument("--batches", type=int, default=3,
                    help="back-to-back batches per side-turn (3)")
    ap.add_argument("--prompt-min", type=int, default=50, help="shortest prompt, tokens (50)")
    ap.add_argument("--prompt-max", type=int, default=600, help="longest prompt, tokens (600)")
    ap.add_argument("--seed", type=int, default=20250101)
    ap.add_argument("--quiet", type=float, default=0.15,
                    help="a round is 'quiet' when other processes used less than this many "
                         "cores in each of its turns (0.15)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 process, 2 rounds, 1 batch of 8 x 16 tokens")
    ap.add_argument("--control", action="store_true",
                    help="A/A control: the 'on' engine starts without the probe too, so "
                         "on/off shows the engine-to-engine bias and noise floor")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick and args.worker is None:
        args.rounds, args.procs, args.batches, args.concurrency, args.max_tokens = 2, 1, 1, 8, 16
    if min(args.rounds, args.procs, args.concurrency, args.max_tokens, args.batches) < 1:
        ap.error("counts must be >= 1")
    if not 1 <= args.prompt_min <= args.prompt_max:
        ap.error("need 1 <= --prompt-min <= --prompt-max")
    if args.prompt_max + args.max_tokens > 4096:
        ap.error("prompt + output must fit the embedded model's 4096-token context")
    args.rounds_per_proc = -(-args.rounds // args.procs)
    # what a worker needs, resolved (so --quick applies there too)
    args.passthrough = ["--rounds", str(args.rounds), "--procs", str(args.procs),
                        "--concurrency", str(args.concurrency),
                        "--max-tokens", str(args.max_tokens), "--batches", str(args.batches),
                        "--prompt-min", str(args.prompt_min),
                        "--prompt-max", str(args.prompt_max), "--seed", str(args.seed),
                        *(["--control"] if args.control else [])]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        asyncio.run(worker(args, args.out, args.worker))
        return 0
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
