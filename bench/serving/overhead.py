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

    python -m bench.serving.overhead             # full run, about 7 minutes on 2 cores
    python -m bench.serving.overhead --control   # the same with the probe off in "on" too
    python -m bench.serving.overhead --quick     # smoke run, about 2 minutes

The sides are in `overhead_sides`, one worker process in `overhead_worker`, the
report in `overhead_report`; this module parses, spawns the workers and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO_ROOT, command_line
from bench.serving.overhead_report import report
from bench.serving.overhead_worker import ENV_STEP_SOCKET, LOG_PREFIX, worker


def spawn(args, tmp: Path, proc_index: int) -> dict:
    """Run one worker in a fresh interpreter; vLLM's logs go to a file."""
    out, logfile = tmp / f"worker-{proc_index}.json", tmp / f"worker-{proc_index}.log"
    cmd = [sys.executable, "-m", __spec__.name, "--worker", str(proc_index),
           "--out", str(out), *args.passthrough]
    env = {k: v for k, v in os.environ.items() if k != ENV_STEP_SOCKET}
    with logfile.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
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
        if line.startswith(LOG_PREFIX):
            print("   ", line[len(LOG_PREFIX):], flush=True)
    return len(lines)


def main_bench(args) -> int:
    command = command_line(__spec__.name)
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
