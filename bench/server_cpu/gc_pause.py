"""What the cyclic garbage collector costs a running server, with its start-up heap
frozen (`serving.engine.allocator.freeze_heap`, the default) and thawed (as before it).

One `tailguard serve` (the engine in float32, policies forced off) runs with a probe in
its process: `gc.callbacks` count every collection by generation with its CPU and its
longest pause, and, when asked, the probe times one full collection (`gc.collect()`,
the GIL held throughout: every stream and the event loop wait for it). A warm-up, then
light load (40 streamed requests at 1 req/s) and saturation (320 short requests from 16
clients) through vLLM's benchmark client, each with the collector's work over it; then
`--rounds` rounds of one full collection frozen and one thawed (the heap re-frozen
after), the order alternating by round.

    python -m bench.server_cpu.gc_pause --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

PROBE_ENV = "TAILGUARD_BENCH_GC_PROBE"  # the probe's state file, in the server's env


def _probe(out: str) -> None:
    """In the server: collection stats by generation, and full collections on request."""
    stats = {g: {"n": 0, "cpu_s": 0.0, "max_pause_s": 0.0} for g in (0, 1, 2)}
    began: list[float] = [0.0, 0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[:] = time.perf_counter(), time.thread_time()
            return
        s = stats[info["generation"]]
        s["n"] += 1
        s["cpu_s"] += time.thread_time() - began[1]
        s["max_pause_s"] = max(s["max_pause_s"], time.perf_counter() - began[0])

    def serve_requests() -> None:
        while True:
            time.sleep(0.2)
            asked = _take(out + ".ask")
            if asked is None:
                continue
            done = _full_collection(asked) if asked != "mark" else {"how": "mark"}
            state = {"stats": stats, "frozen": gc.get_freeze_count(), "done": done,
                     "asked": asked}
            Path(out + ".tmp").write_text(json.dumps(state))
            os.replace(out + ".tmp", out)
            for s in stats.values():  # the longest pause since the last question
                s["max_pause_s"] = 0.0

    gc.callbacks.append(on_gc)
    threading.Thread(target=serve_requests, daemon=True).start()


def _take(path: str) -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    os.remove(path)
    return text


def _full_collection(how: str) -> dict:
    """One timed `gc.collect()` with the heap as it is (frozen) or thawed first."""
    frozen = gc.get_freeze_count()
    if how == "thawed":
        gc.unfreeze()
    tracked = len(gc.get_objects())
    wall, cpu = time.perf_counter(), time.thread_time()
    gc.collect()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    if how == "thawed" and frozen:
        gc.freeze()  # as the server had it
    return {"how": how, "tracked": tracked, "pause_s": wall, "cpu_s": cpu}


def _ask(out: str, how: str) -> dict:
    Path(out + ".ask").write_text(how)
    for _ in range(600):
        time.sleep(0.1)
        try:
            state = json.loads(Path(out).read_text())
        except (OSError, ValueError):
            continue
        if state.get("asked") == how and state.get("done"):
            Path(out).unlink()
            return state
    raise TimeoutError(f"the probe did not answer {how!r}")


def _delta(after: dict, before: dict, requests: int) -> str:
    parts = []
    for g in "012":
        n = after[g]["n"] - before[g]["n"]
        cpu = after[g]["cpu_s"] - before[g]["cpu_s"]
        parts.append(f"gen{g}: {n} collections, {1000 * cpu / requests:.3f} ms CPU a "
                     f"request, longest {1000 * after[g]['max_pause_s']:.1f} ms")
    return "; ".join(parts)


def _serve_with_probe(argv: list[str]) -> None:
    _probe(os.environ[PROBE_ENV])
    sys.argv = ["tailguard", *argv]
    from tailguard.cli import main

    main()


def measure(rounds: int) -> None:
    from bench.serving import vllm_client as C
    from bench.serving.vs_vllm import NAME, TOKEN, _free_port, force_policies_off, start
    from serving.engine.allocator import find_tcmalloc
    from serving.engine.embedded_model import ensure_model

    port, model = _free_port(), str(ensure_model())
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/gc.json"
        env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=TOKEN, VLLM_CPU_KVCACHE_SPACE="1",
                   LD_PRELOAD=find_tcmalloc() or "", **{PROBE_ENV: out})  # no re-exec
        cmd = [sys.executable, "-m", "bench.server_cpu.gc_pause", "--serve", "serve",
               "--port", str(port), "--db", f"{tmp}/trace.duckdb", "--", "--dtype", "float32"]
        server = start(cmd, url, Path(tmp) / "server.log", env)
        try:
            force_policies_off(url)
            C.run(url, server.pid, NAME, model, C.light(4.0, 8), 0, "warm-")
            state = _ask(out, "mark")
            first = state["stats"]["2"]
            print(f"start-up and warm-up: {first['n']} full collections, the longest "
                  f"{1000 * first['max_pause_s']:.1f} ms; heap frozen after it: "
                  f"{state['frozen']} objects", flush=True)
            for work in (C.light(1.0, 40), C.saturate(16, 320)):
                done = C.run(url, server.pid, NAME, model, work, 1, f"{work.name}-")["completed"]
                after = _ask(out, "mark")
                print(f"{work.name} ({done} requests): "
                      f"{_delta(after['stats'], state['stats'], done)}; "
                      f"{after['frozen']} objects frozen", flush=True)
                state = after
            pauses: dict[str, list[float]] = {"frozen": [], "thawed": []}
            for rnd in range(rounds):
                for how in ("frozen", "thawed") if rnd % 2 == 0 else ("thawed", "frozen"):
                    done = _ask(out, how)["done"]
                    pauses[how].append(done["pause_s"])
                    print(f"round {rnd + 1} {how}: a full collection over "
                          f"{done['tracked']} objects, {1000 * done['pause_s']:.1f} ms "
                          f"({1000 * done['cpu_s']:.1f} ms CPU)", flush=True)
            for how, values in pauses.items():
                print(f"{how}: median {1000 * statistics.median(values):.1f} ms "
                      f"[{1000 * min(values):.1f}-{1000 * max(values):.1f}]")
        finally:
            server.terminate()
            server.wait()


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:
        _serve_with_probe(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    measure(ap.parse_args().rounds)


if __name__ == "__main__":
    main()
