"""What continuous profiling costs the engine: generated tokens/s and CPU per token with
the pyroscope-io agent off and on, on the real vLLM engine and the embedded model.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: vLLM's `LLM` then
keeps its engine core in-process and runs the model forward on the main thread), so the
agent started here samples exactly what the agent in the server's engine-core process
would: the forward, the sampler and the scheduler. Every engine step runs inside
`phase_tags(*step_tags(scheduler_output))`, the wiring the step plugin needs; with the
agent off that is one `is_profiling()` check. Pushes go to a loopback sink that
discards them (every `--upload-interval` seconds; 10 s is the agent's default).

This machine is noisy (±8%, and other tenants' bursts of a whole core), so only
interleaved comparisons mean anything: each round runs both sides, in alternating
order, and takes the on/off ratios; their median, min and max are reported over all
rounds and over the quiet ones (other processes took at most `--quiet` cores during
both turns, from /proc/stat). Ratios: generated tokens/s; CPU per generated token of
the engine thread (the main one here); and the CPU of the agent's own threads, in
cores. `--control` is an A/A run (the "on" side starts no agent): the noise floor.
Last, the per-call cost of `phase_tags` and of a root span with pyroscope-otel's span
processor (what each `llm.request`/`llm.step` pays), timed in a loop.

    python -m bench.serving.profiling_overhead               # 1-5 minutes on 2 cores
    python -m bench.serving.profiling_overhead --control     # A/A: the noise floor
    python -m bench.serving.profiling_overhead --quick       # smoke run, 2 rounds
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from serving import profiling as P  # noqa: E402

FIRST_TOKEN_ID = 3  # skip the special tokens at the start of the embedded vocab


class _Discard(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_sink() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}"


def tag_engine_steps() -> None:
    """What the step plugin would do around `execute_model` in the engine core."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    execute_model = GPUModelRunner.execute_model

    def tagged(self, scheduler_output, *args, **kwargs):
        if not P.is_profiling():
            return execute_model(self, scheduler_output, *args, **kwargs)
        with P.phase_tags(*P.step_tags(scheduler_output)):
            return execute_model(self, scheduler_output, *args, **kwargs)

    GPUModelRunner.execute_model = tagged


def thread_cpu_s(tids) -> float:
    """CPU seconds (user + system) of this process's threads `tids` (Linux)."""
    total = 0.0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread has exited
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def busy_cpu_s() -> tuple[float, float]:
    """(CPU seconds every process on the box has used, this process's), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as fh:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(
            int, fh.readline().split()[1:9])
    with open("/proc/self/stat") as fh:
        mine = fh.read().rsplit(")", 1)[1].split()
    return ((user + nice + system + irq + softirq + steal) / tick,
            (int(mine[11]) + int(mine[12])) / tick)


def start_agent(config) -> set[str]:
    """Start the agent; returns the thread ids that existed before it."""
    before = set(os.listdir("/proc/self/task"))
    P.start_profiling(config, "bench", process=P.PROCESS_ENGINE)
    return before


class Workload:
    """The same prompt lengths every batch, fresh token ids (the prefix cache never hits)."""

    def __init__(self, args):
        rng = random.Random(0)
        self.lengths = [rng.randint(args.prompt_min, args.prompt_max)
                        for _ in range(args.requests)]
        self.batches = 0

    def prompts(self) -> list[dict]:
        self.batches += 1
        rng = random.Random(self.batches)
        return [{"prompt_token_ids": [rng.randrange(FIRST_TOKEN_ID, 8000) for _ in range(n)]}
                for n in self.lengths]


def side_turn(llm, work: Workload, params, batches: int, agent_from: set | None) -> dict:
    """Generated tokens/s; the engine thread's CPU per token (the forward runs on this,
    the main, thread); CPU of the threads started since `agent_from` (the agent's) and
    of other processes on the box, in cores."""
    prompts = [work.prompts() for _ in range(batches)]
    t0, cpu0, box0, tokens = time.monotonic(), time.thread_time(), busy_cpu_s(), 0
    for batch in prompts:
        outs = llm.generate(batch, params, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    wall, cpu, box = time.monotonic() - t0, time.thread_time() - cpu0, busy_cpu_s()
    foreign = ((box[0] - box0[0]) - (box[1] - box0[1])) / wall
    agent = set(os.listdir("/proc/self/task")) - agent_from if agent_from else ()
    return {"tokens_s": tokens / wall, "cpu_ms_per_token": 1e3 * cpu / tokens,
            "agent_cores": thread_cpu_s(agent) / wall, "foreign_cores": max(0.0, foreign)}


def per_call_us(fn, n: int = 20000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.perf_counter() - t0) / n


def micro_costs(config) -> dict:
    """µs per call: phase_tags off/on, and a root span with/without pyroscope-otel."""
    from opentelemetry.sdk.trace import TracerProvider

    def tags():
        with P.phase_tags("decode", "0-1k"):
            pass

    plain, linked = TracerProvider(), TracerProvider()
    out = {"phase_tags off": per_call_us(tags)}
    out["root span, no profiling"] = per_call_us(
        lambda: plain.get_tracer("b").start_span("llm.step").end())
    P.start_profiling(config, "bench", tracer_provider=linked)
    try:
        out["phase_tags on"] = per_call_us(tags)
        out["root span + pyroscope-otel"] = per_call_us(
            lambda: linked.get_tracer("b").start_span("llm.step").end())
    finally:
        P.stop_profiling()
    return out


def summary(name: str, ratios: list[float]) -> str:
    return (f"{name}: median {statistics.median(ratios):.3f}  min {min(ratios):.3f}  "
            f"max {max(ratios):.3f}  (n={len(ratios)})")


def run_rounds(llm, work: Workload, params, config, args) -> list[dict]:
    """Per round: both sides, in alternating order; the on/off ratios."""
    rounds = []
    for r in range(args.rounds):
        result = {}
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            agent_from = start_agent(config) if side == "on" and not args.control else None
            try:
                result[side] = side_turn(llm, work, params, args.batches, agent_from)
            finally:
                P.stop_profiling()
        off, on = result["off"], result["on"]
        rounds.append({"tokens": on["tokens_s"] / off["tokens_s"],
                       "cpu": on["cpu_ms_per_token"] / off["cpu_ms_per_token"],
                       "agent": on["agent_cores"],
                       "foreign": max(on["foreign_cores"], off["foreign_cores"])})
        print(f"round {r:2d}: tokens/s off {off['tokens_s']:4.0f} on {on['tokens_s']:4.0f} "
              f"ratio {rounds[-1]['tokens']:.3f} | engine CPU/token ratio "
              f"{rounds[-1]['cpu']:.3f} | agent {100 * on['agent_cores']:.1f}% of a core | "
              f"foreign load {rounds[-1]['foreign']:.2f} cores", flush=True)
    return rounds


def report(rounds: list[dict], args) -> None:
    label = "A/A control" if args.control else f"agent at {args.sample_rate} Hz"
    quiet = [r for r in rounds if r["foreign"] <= args.quiet]
    for name, subset in (("all rounds", rounds),
                         (f"quiet rounds (<= {args.quiet} foreign cores)", quiet)):
        if subset:
            print(f"-- {name}, {label}")
            print(summary("tokens/s on/off", [r["tokens"] for r in subset]))
            print(summary("engine-thread CPU per token on/off", [r["cpu"] for r in subset]))
            print(summary("agent threads, cores", [r["agent"] for r in subset]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batches", type=int, default=8,
                    help="batches per side-turn (one batch takes about half a second: too "
                         "short for the agent's CPU to register in 10 ms clock ticks)")
    ap.add_argument("--requests", type=int, default=8, help="prompts per batch")
    ap.add_argument("--prompt-min", type=int, default=32)
    ap.add_argument("--prompt-max", type=int, default=1200)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--sample-rate", type=int, default=100, help="agent samples/s")
    ap.add_argument("--upload-interval", type=int, default=10, help="agent push period, s")
    ap.add_argument("--quiet", type=float, default=0.3,
                    help="a round is quiet when other processes took at most this many cores")
    ap.add_argument("--control", action="store_true", help="A/A: 'on' starts no agent")
    ap.add_argument("--quick", action="store_true", help="2 rounds")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 2

    from vllm import LLM, SamplingParams

    from serving.engine.embedded_model import ensure_model

    llm = LLM(model=str(ensure_model()), enforce_eager=True, seed=0,
              distributed_executor_backend="uni")
    tag_engine_steps()
    work = Workload(args)
    params = SamplingParams(max_tokens=args.output_tokens, ignore_eos=True, temperature=0)
    config = P.ProfilingConfig(start_sink(), sample_rate=args.sample_rate,
                               upload_interval_s=args.upload_interval)
    side_turn(llm, work, params, 2, None)  # warm-up: every shape of the workload once

    report(run_rounds(llm, work, params, config, args), args)
    for name, us in micro_costs(config).items():
        print(f"{name}: {us:.2f} µs/call")


if __name__ == "__main__":
    main()
