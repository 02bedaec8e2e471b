"""What the engine's allocator settings do (serving/engine/allocator.py): resident-memory
growth and batch time of the real vLLM engine on the embedded model, under glibc
malloc or tcmalloc, with oneDNN's global primitive cache on (1024, its default) or off.

Each run is a fresh process (LD_PRELOAD only takes effect at process start) with the
engine in-process. Two workloads:
- `shapes`: 300 single prompts of fresh random lengths (1-2000 tokens), one output
  token each, so every step has a batch size (M) not seen before; then the same 300
  lengths again. Growth that the second pass does not repeat is a per-shape cache.
- `batches`: 40 batches of 16 prompts of 300-700 tokens and 16-48 output tokens, the
  soak's shape: the time they take and the RSS growth.

The machine is noisy (±8%), so configurations alternate, round by round, and each
cell reports every round.

    python -m bench.serving.allocator                 # about 6 minutes
    python -m bench.serving.allocator --rounds 1      # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

from bench.common import REPO_ROOT

CONFIGS = {
    "glibc, cache on": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"},
    "glibc, cache off": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"},
    "tcmalloc, cache on": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "tcmalloc": "1"},
    "tcmalloc, cache off (serve's default)": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0",
                                              "tcmalloc": "1"},
}


def child(workload: str) -> dict:
    """Runs inside the measured process."""
    import psutil

    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    from vllm import LLM, SamplingParams

    from serving.engine.embedded_model import ensure_model

    llm = LLM(model=str(ensure_model()), enforce_eager=True, distributed_executor_backend="uni",
              enable_prefix_caching=False)
    rss = lambda: psutil.Process().memory_info().rss / 2**20  # noqa: E731
    rng = random.Random(0)
    start_rss, start = rss(), time.perf_counter()
    if workload == "shapes":
        lengths = [rng.randint(1, 2000) for _ in range(300)]
        one = SamplingParams(max_tokens=1)
        marks = []
        for _ in range(2):
            for n in lengths:
                prompt = {"prompt_token_ids": [rng.randint(5, 8000) for _ in range(n)]}
                llm.generate([prompt], one, use_tqdm=False)
            marks.append(rss() - start_rss)
        return {"first_pass_mib": marks[0], "second_pass_mib": marks[1] - marks[0]}
    for _ in range(40):
        prompts = [{"prompt_token_ids": [rng.randint(5, 8000) for _ in range(rng.randint(300, 700))]}
                   for _ in range(16)]
        llm.generate(prompts, SamplingParams(max_tokens=rng.randint(16, 48), ignore_eos=True),
                     use_tqdm=False)
    return {"seconds": time.perf_counter() - start, "growth_mib": rss() - start_rss}


def run(config: dict, workload: str) -> dict:
    from serving.engine.allocator import find_tcmalloc

    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = config["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
    if config.get("tcmalloc"):
        library = find_tcmalloc()
        if library is None:
            sys.exit("libtcmalloc_minimal.so.4 not found (Debian: libtcmalloc-minimal4)")
        env["LD_PRELOAD"] = library
    out = subprocess.run([sys.executable, "-m", __spec__.name, "--child", workload], env=env,
                         capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=["shapes", "batches"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child)), flush=True)
        return
    results: dict = {(name, w): [] for name in CONFIGS for w in ("shapes", "batches")}
    for r in range(args.rounds):
        names = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
        for name in names:
            for workload in ("shapes", "batches") if r == 0 else ("batches",):
                results[(name, workload)].append(run(CONFIGS[name], workload))
                print(name, workload, results[(name, workload)][-1], flush=True)
    print("\n| configuration | shapes: 1st pass / 2nd pass (MiB) | batches: seconds "
          "| batches: RSS growth (MiB) |\n|---|---|---|---|")
    for name in CONFIGS:
        shapes = results[(name, "shapes")][0]
        batches = results[(name, "batches")]
        secs = ", ".join(f"{b['seconds']:.1f}" for b in batches)
        grow = ", ".join(f"{b['growth_mib']:.0f}" for b in batches)
        print(f"| {name} | +{shapes['first_pass_mib']:.0f} / +{shapes['second_pass_mib']:.0f} "
              f"| {secs} | {grow} |")


if __name__ == "__main__":
    main()
