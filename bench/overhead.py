"""What full observation costs the engine: generated tokens/s and TTFT, observed vs bare.

Two measurements, each alternating its two sides within one run (this machine is noisy,
so only same-run, interleaved comparisons mean anything):

  1. Observation path, one engine (one `Runtime`, real DuckDB trace file in a temp dir):
       A "bare"     - N concurrent `AsyncLLM.generate()` calls on the runtime's engine;
       B "observed" - the same workload through what the HTTP layer does, minus HTTP:
                      `observer.begin()`, `current_request` set, `ObservedEngine.generate()`,
                      `rec.model`, `observer.finish()` (spans, metrics, SLO verdict, trace row).
     A warm-up round (both sides) is discarded, then R rounds; odd rounds run A first,
     even rounds B first. The step probe, the ledger thread, the stat logger and the 1 s
     engine-stats ticker run in both sides (they are always on in a server), so this
     isolates the per-request path.
  2. Step probe: engines started with and without `TAILGUARD_STEP_SOCKET` (unset ->
     the plugin is inert), a bare `StepLedger` receiving the datagrams in the "with"
     case, the same bare-generate workload. One engine per subprocess, alternating
     off/on, on/off, ... for P pairs.

Workload: fixed seed, N concurrent requests submitted together, prompt lengths drawn
uniformly from [--prompt-min, --prompt-max] tokens (the same lengths every run, fresh
random token ids per run so the prefix cache never hits), M output tokens, ignore_eos,
greedy. Per run: tokens/s = N*M / wall time of the run; TTFT = time from the batch's
submit to the request's first output carrying tokens.

    python bench/overhead.py                 # full run, ~6-8 minutes on 2 cores
    python bench/overhead.py --quick         # smoke run, ~2 minutes
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

SETTLE_S = 1.2  # pause after each run: lets the 1 s trace-log flush of its rows land
FIRST_TOKEN_ID = 3  # skip the special tokens at the start of the embedded vocab


# ---------------------------------------------------------------- workload

def prompt_lengths(args) -> list[int]:
    rng = random.Random(args.seed)
    return [rng.randint(args.prompt_min, args.prompt_max) for _ in range(args.concurrency)]


def make_prompts(args, run_index: int, vocab: int) -> list[list[int]]:
    rng = random.Random(args.seed * 1_000_003 + run_index)
    return [[rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(n)]
            for n in prompt_lengths(args)]


def vocab_size(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["vocab_size"]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def run_bare(engine, prompts, params) -> dict:
    """N concurrent bare `AsyncLLM.generate()` calls."""
    t0 = time.monotonic()

    async def one(prompt) -> tuple[float, int]:
        first, n = None, 0
        async for out in engine.generate({"prompt_token_ids": prompt}, params,
                                         f"cmpl-{uuid.uuid4().hex}-0"):
            n = len(out.outputs[0].token_ids)
            if n and first is None:
                first = time.monotonic()
        return first - t0, n

    results = await asyncio.gather(*(one(p) for p in prompts))
    return {"wall_s": time.monotonic() - t0, "ttfts": [r[0] for r in results],
            "tokens": sum(r[1] for r in results)}


async def run_observed(runtime, prompts, params) -> dict:
    """The same calls through the full observation path (what serving/generation.py
    does for a non-streaming completion, minus HTTP and vLLM's OpenAI layer)."""
    from serving.engine import current_request

    observer, engine = runtime.observer, runtime.handle.engine
    model_name = runtime.config.model_name
    clock = time.perf_counter
    t0 = time.monotonic()

    async def one(prompt) -> tuple:
        c = clock()
        rec, span = observer.begin("text_completion", {})
        current_request.set(rec)  # each gather() task has its own context copy
        rec.model = model_name
        begin_s = clock() - c
        first, n = None, 0
        async for out in engine.generate({"prompt_token_ids": prompt}, params,
                                         f"cmpl-{rec.request_id}-0"):
            n = len(out.outputs[0].token_ids)
            if n and first is None:
                first = time.monotonic()
        c = clock()
        observer.finish(rec, span)
        finish_s = clock() - c
        return first - t0, n, rec.status != "ok", rec.tally.steps > 0, begin_s, finish_s

    results = await asyncio.gather(*(one(p) for p in prompts))
    return {"wall_s": time.monotonic() - t0, "ttfts": [r[0] for r in results],
            "tokens": sum(r[1] for r in results), "not_ok": sum(r[2] for r in results),
            "probe_credited": sum(r[3] for r in results),
            "begin_s": sum(r[4] for r in results), "finish_s": sum(r[5] for r in results)}


async def run_side(args, run, make, batches: int, settle_s: float) -> dict:
    """`batches` back-to-back batches of one side -> tokens/s over their summed wall
    time and TTFT percentiles over all their requests."""
    parts = []
    for _ in range(batches):
        parts.append(await run(make()))
    await asyncio.sleep(settle_s)
    wall = sum(p["wall_s"] for p in parts)
    ttfts = [t for p in parts for t in p["ttfts"]]
    tokens = sum(p["tokens"] for p in parts)
    out = {"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall,
           "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
           "requests": len(ttfts)}
    for key in ("not_ok", "probe_credited", "begin_s", "finish_s"):
        if key in parts[0]:
            out[key] = sum(p[key] for p in parts)
    return out


def sampling_params(args):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0)


# ---------------------------------------------------------------- workers (subprocesses)

async def worker_observation(args, out_path: Path) -> None:
    """Measurement 1: one Runtime, bare and observed sides alternating."""
    from serving.config import ServerConfig
    from serving.model import ensure_model
    from serving.runtime import Runtime

    model = ensure_model()
    vocab = vocab_size(model)
    params = sampling_params(args)
    with tempfile.TemporaryDirectory(prefix="tailguard-bench-") as tmp:
        db = Path(tmp) / "trace.duckdb"
        runtime = Runtime(ServerConfig(model=str(model), db=str(db)))
        t = time.monotonic()
        await runtime.start()
        log(f"runtime up in {time.monotonic() - t:.1f}s; trace log {db}")
        rounds, counter = [], iter(range(10**9))

        def next_prompts():
            return make_prompts(args, next(counter), vocab)

        try:
            for r in range(args.rounds + 1):  # round 0 is the warm-up
                order = ("bare", "observed") if r % 2 else ("observed", "bare")
                result = {"round": r, "order": order}
                for side in order:
                    if side == "bare":
                        run = lambda p: run_bare(runtime.handle.engine._engine, p, params)  # noqa: E731
                    else:
                        run = lambda p: run_observed(runtime, p, params)  # noqa: E731
                    result[side] = await run_side(args, run, next_prompts, args.batches,
                                                  SETTLE_S)
                result["ratio"] = result["observed"]["tok_s"] / result["bare"]["tok_s"]
                log(f"round {r}{' (warm-up)' if r == 0 else ''}: "
                    f"bare {result['bare']['tok_s']:.0f} tok/s, "
                    f"observed {result['observed']['tok_s']:.0f} tok/s, "
                    f"ratio {result['ratio']:.4f}")
                rounds.append(result)
            runtime.tracelog.flush()
            stats = runtime.tracelog.stats()
        finally:
            await runtime.stop()
        steps = runtime.ledger.steps_seen
    out_path.write_text(json.dumps({"rounds": rounds, "tracelog": stats,
                                    "steps_seen": steps}, default=str))


async def worker_probe(args, out_path: Path, probe_on: bool) -> None:
    """Measurement 2: one bare engine, with or without the step probe."""
    from serving.engine import start_engine, vllm_namespace
    from serving.engine_stats import EngineSecond, stat_logger_factory
    from serving.model import ensure_model
    from serving.step_plugin import ENV_STEP_SOCKET
    from serving.steps import StepLedger

    model = ensure_model()
    vocab = vocab_size(model)
    params = sampling_params(args)
    os.environ.pop(ENV_STEP_SOCKET, None)
    ledger = StepLedger().start() if probe_on else None
    t = time.monotonic()
    engine = start_engine(vllm_namespace(str(model), None, []),
                          [stat_logger_factory(EngineSecond())])
    await engine.get_supported_tasks()
    log(f"engine (probe {'on' if probe_on else 'off'}) up in {time.monotonic() - t:.1f}s")
    runs, counter = [], iter(range(10**9))
    try:
        for _ in range(args.probe_reps + 1):  # run 0 is the warm-up
            runs.append(await run_side(
                args, lambda p: run_bare(engine, p, params),
                lambda: make_prompts(args, next(counter), vocab), args.batches, 0.3))
    finally:
        engine.shutdown()
        steps = 0
        if ledger is not None:
            ledger.close()
            steps = ledger.steps_seen
    out_path.write_text(json.dumps({"probe": probe_on, "runs": runs, "steps_seen": steps}))


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- orchestration

def spawn(args, worker: str, tmp: Path, tag: str, extra: list[str] = ()) -> dict:
    """Run one worker in a fresh interpreter; its vLLM logs go to a file."""
    out = tmp / f"{tag}.json"
    logfile = tmp / f"{tag}.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", worker,
           "--out", str(out), *args.passthrough, *extra]
    env = dict(os.environ)
    env.pop("TAILGUARD_STEP_SOCKET", None)
    with logfile.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                              cwd=ROOT, timeout=args.worker_timeout)
    text = logfile.read_text()
    for line in text.splitlines():
        if line.startswith("[overhead]"):
            print("   ", line[len("[overhead] "):], flush=True)
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"worker {tag} failed (rc {proc.returncode}); log tail:\n{text[-4000:]}")
    return json.loads(out.read_text())


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def main_bench(args) -> int:
    command = "python bench/overhead.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tailguard-overhead-") as tmpdir:
        tmp = Path(tmpdir)
        print(f"== 1. observation path: {args.rounds} rounds (+1 warm-up), "
              f"{args.concurrency} x {args.max_tokens} tokens", flush=True)
        obs = spawn(args, "observation", tmp, "observation")
        print(f"== 2. step probe: {args.probe_pairs} engine pairs, "
              f"{args.probe_reps} runs each (+1 warm-up)", flush=True)
        pairs = []
        for p in range(args.probe_pairs):
            order = (False, True) if p % 2 == 0 else (True, False)
            pair = {}
            for on in order:
                pair[on] = spawn(args, "probe", tmp, f"probe-{p}-{'on' if on else 'off'}",
                                 ["--probe", "on" if on else "off"])
            pairs.append(pair)
    elapsed = time.monotonic() - t_all
    report(args, command, obs, pairs, elapsed)
    return 0


def report(args, command: str, obs: dict, pairs: list[dict], elapsed: float) -> None:
    rounds = [r for r in obs["rounds"] if r["round"] > 0]
    med = lambda side, key: statistics.median(r[side][key] for r in rounds)  # noqa: E731
    ratios = lambda key: [r["observed"][key] / r["bare"][key] for r in rounds]  # noqa: E731
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731

    def probe_tok_s(run: dict) -> float:
        return statistics.median(x["tok_s"] for x in run["runs"][1:])

    def probe_ttft(run: dict, key: str) -> float:
        return statistics.median(x[key] for x in run["runs"][1:])

    p_ratios = [probe_tok_s(p[True]) / probe_tok_s(p[False]) for p in pairs]

    print()
    print(f"### Observation overhead ({args.concurrency} concurrent requests, prompts "
          f"{args.prompt_min}-{args.prompt_max} tokens, {args.max_tokens} output tokens, "
          f"ignore_eos, greedy)")
    print()
    print(f"1. Observation path, one engine, {len(rounds)} alternating rounds "
          "(value = median over rounds; ratio = observed/bare per round, median [min-max])")
    print()
    print("| metric | bare | observed | ratio median [min-max] |")
    print("|---|---:|---:|---:|")
    print(f"| generated tokens/s | {med('bare', 'tok_s'):.0f} | {med('observed', 'tok_s'):.0f} "
          f"| {spread(ratios('tok_s'), '{:.4f}')} |")
    print(f"| TTFT p50 | {ms(med('bare', 'ttft_p50'))} | {ms(med('observed', 'ttft_p50'))} "
          f"| {spread(ratios('ttft_p50'))} |")
    print(f"| TTFT p99 | {ms(med('bare', 'ttft_p99'))} | {ms(med('observed', 'ttft_p99'))} "
          f"| {spread(ratios('ttft_p99'))} |")
    print(f"| round wall time | {med('bare', 'wall_s'):.2f} s | {med('observed', 'wall_s'):.2f} s "
          f"| {spread(ratios('wall_s'), '{:.4f}')} |")
    print()
    print(f"2. Step probe, {len(pairs)} engine pairs started alternately (value = median "
          f"over engines of each engine's median over {args.probe_reps} runs; ratio = "
          "with/without per pair)")
    print()
    print("| metric | probe off | probe on | ratio median [min-max] |")
    print("|---|---:|---:|---:|")
    for key, label in (("tok_s", "generated tokens/s"), ("ttft_p50", "TTFT p50"),
                       ("ttft_p99", "TTFT p99")):
        get = probe_tok_s if key == "tok_s" else (lambda run, k=key: probe_ttft(run, k))
        off = statistics.median(get(p[False]) for p in pairs)
        on = statistics.median(get(p[True]) for p in pairs)
        rs = [get(p[True]) / get(p[False]) for p in pairs]
        fmt_v = (lambda v: f"{v:.0f}") if key == "tok_s" else ms
        print(f"| {label} | {fmt_v(off)} | {fmt_v(on)} | "
              f"{spread(rs, '{:.4f}' if key == 'tok_s' else '{:.3f}')} |")
    print()
    per_round = ", ".join(f"{r['ratio']:.4f}" for r in rounds)
    print(f"per-round tokens/s ratios (observed/bare): {per_round}")
    print("per-pair tokens/s ratios (probe on/off): " + ", ".join(f"{r:.4f}" for r in p_ratios))
    combined = statistics.median(ratios("tok_s")) * statistics.median(p_ratios)
    print(f"combined (observation path x probe, medians): {combined:.4f} "
          f"-> overhead {100 * (1 - combined):+.2f}%")
    obs_rounds = [r["observed"] for r in rounds]
    print(f"checks: observed requests not ok = {sum(r['not_ok'] for r in obs_rounds)}, "
          f"requests credited by the probe = {sum(r['probe_credited'] for r in obs_rounds)}/"
          f"{sum(r['requests'] for r in obs_rounds)}, trace-log requests rows = "
          f"{obs['tracelog']['rows_written'].get('requests')} (incl. warm-up), rows dropped = {obs['tracelog'].get('rows_dropped')}, "
          f"probe steps received: on {[p[True]['steps_seen'] for p in pairs]}, "
          f"off {[p[False]['steps_seen'] for p in pairs]}")
    n_req = sum(r["requests"] for r in obs_rounds)
    print(f"event-loop time in the observer per request: begin {1e6 * sum(r['begin_s'] for r in obs_rounds) / n_req:.0f} us, "
          f"finish {1e6 * sum(r['finish_s'] for r in obs_rounds) / n_req:.0f} us")
    print(f"elapsed {elapsed:.0f} s")
    print()
    print(f"reproduce: {command}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6,
                    help="measured rounds of the observation comparison (default 6)")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent requests (32)")
    ap.add_argument("--max-tokens", type=int, default=64, help="output tokens each (64)")
    ap.add_argument("--batches", type=int, default=3,
                    help="back-to-back batches per side per round/run (3)")
    ap.add_argument("--prompt-min", type=int, default=50, help="shortest prompt, tokens (50)")
    ap.add_argument("--prompt-max", type=int, default=600, help="longest prompt, tokens (600)")
    ap.add_argument("--probe-pairs", type=int, default=4,
                    help="probe off/on engine pairs (4)")
    ap.add_argument("--probe-reps", type=int, default=2,
                    help="measured runs per probe engine (2)")
    ap.add_argument("--seed", type=int, default=20250101)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 rounds, 8 x 16 tokens, 1 probe pair of 1 run")
    ap.add_argument("--worker-timeout", type=float, default=600, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("observation", "probe"), help=argparse.SUPPRESS)
    ap.add_argument("--probe", choices=("on", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.concurrency, args.max_tokens = 2, 8, 16
        args.probe_pairs, args.probe_reps, args.batches = 1, 1, 1
    if args.rounds < 1 or args.concurrency < 1 or args.max_tokens < 1:
        ap.error("--rounds, --concurrency and --max-tokens must be >= 1")
    if not 1 <= args.prompt_min <= args.prompt_max:
        ap.error("need 1 <= --prompt-min <= --prompt-max")
    if args.prompt_max + args.max_tokens > 4096:
        ap.error("prompt + output must fit the embedded model's 4096-token context")
    # what the workers need, already resolved (so --quick applies there too)
    args.passthrough = ["--rounds", str(args.rounds), "--concurrency", str(args.concurrency),
                        "--max-tokens", str(args.max_tokens), "--batches", str(args.batches),
                        "--prompt-min", str(args.prompt_min),
                        "--prompt-max", str(args.prompt_max),
                        "--probe-reps", str(args.probe_reps), "--seed", str(args.seed)]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker == "observation":
        asyncio.run(worker_observation(args, args.out))
        return 0
    if args.worker == "probe":
        asyncio.run(worker_probe(args, args.out, args.probe == "on"))
        return 0
    return main_bench(args)


if __name__ == "__main__":
    sys.exit(main())
