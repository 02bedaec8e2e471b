"""Benchmark: tailguard vs vLLM's own OpenAI server, same model, same engine flags,
measured with vLLM's own benchmark client (`bench/serving/vllm_client.py`).

Both servers run side by side on loopback (an idle engine waits on its socket and
costs little CPU). vLLM's server starts as its CPU guide recommends: tcmalloc
preloaded, `VLLM_CPU_KVCACHE_SPACE` set; `tailguard serve` preloads tcmalloc itself.
tailguard runs with every default on (spans, trace log, per-step rows, SLO verdicts,
prediction, the deadline check's estimate, the policy engine's tick, memory forecast);
its degradation policies and batch-size controller are forced off through the admin
API (`--policies off`, the default): they act on their own thresholds (batch control
halves the concurrency limit when TTFT P99 passes 0.5 s, token cap and truncation on
queue depth and load), which a closed loop at saturation crosses whatever the SLO, so
with them on the run measures their decisions, not the serving path's cost (the surge
benchmark's subject). `--policies auto` leaves them on, under an SLO spec with loose
targets (`loose_slo.yaml`). Engine flags for both come from `--engine-arg`; the dtype
tailguard chooses for this CPU (`--dtype float32` without bfloat16 hardware) goes to
both.

Each round, each side in turn (the side that goes first alternates by round) takes:
1. light load: streamed, mixed prompt lengths, Poisson arrivals at `--light-rate`
   req/s: TTFT and TPOT p50/p99 as vLLM's client reports them; for tailguard also
   the requests whose engine phases (tokenize, queue, prefill, decode: the trace log)
   sum to under 0.1 s but took over 0.15 s end to end at the client (stalls);
2. saturation: a closed loop of `--concurrency` clients of short requests: output
   tokens/s and requests/s;
and for both, CPU seconds of the server process itself per completed request (utime +
stime of its threads from /proc; the engine core is a child and not counted; the
client's own set-up, a second or two while the server idles, is counted too; and on
tailguard a `POST /admin/flush` after the run, so that the run's rows are loaded into
DuckDB inside its count rather than by the once-a-minute load in another run); and for
both, the event-loop lag over each run (tailguard's `/metrics` histogram, and the same
monitor run in vLLM's loop by `vllm_lag_probe`; read before and after: the bound under
which 99% and all of the run's samples fell).

A warm-up round (both sides, short) is dropped. Every run prints one line; the report
gives every round and the per-round tailguard/vLLM ratios' median [min-max].

    python -m bench.serving.vs_vllm --rounds 5 --engine-arg=--dtype --engine-arg=float32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import command_line
from bench.serving import vllm_client as C
from bench.serving.vllm_lag_probe import PROBE_METRIC
from observe import registry as R
from serving.engine.allocator import find_tcmalloc
from serving.engine.embedded_model import ensure_model
from serving.engine.setup import cpu_dtype_flags, scheduling_flags

NAME = "tailguard-tiny-llama"
SIDES = ("vllm", "tailguard")
TOKEN = "vs-vllm-bench-admin-token"
POLICIES = ("breaker_l1", "breaker_l2", "token_cap", "vip_only", "memory_pressure",
            "truncation", "predicted_miss", "batch_control")
LOOSE_SLO = Path(__file__).with_name("loose_slo.yaml")
STALL_PHASES_S, STALL_E2E_S = 0.1, 0.15


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], url: str, log: Path, env: dict) -> subprocess.Popen:
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"{cmd[:4]} exited; see {log}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return process
        except OSError:
            time.sleep(1)
    sys.exit(f"not ready: {log}")


def vllm_command(model: str, port: int, engine_args: list[str]) -> list[str]:
    """vLLM's own OpenAI server as its CPU guide runs it: eager, in-process executor;
    with tailguard's event-loop lag probe on its loop (`vllm_lag_probe`)."""
    return [sys.executable, "-m", "bench.serving.vllm_lag_probe", "--model", model,
            "--served-model-name", NAME, "--enforce-eager", "--port", str(port),
            "--host", "127.0.0.1", "--distributed-executor-backend", "uni",
            "--disable-uvicorn-access-log", *engine_args]


def servers(tmp: Path, engine_args: list[str], policies: str) -> dict:
    """Both servers on the same engine flags: the dtype tailguard would choose for this
    CPU (float32 where bfloat16 is emulated) and its scheduling policy (priority) are
    given to vLLM too, unless set."""
    engine_args = [*engine_args, *cpu_dtype_flags(engine_args), *scheduling_flags(engine_args)]
    model = str(ensure_model())
    ports = {side: _free_port() for side in SIDES}
    urls = {side: f"http://127.0.0.1:{port}" for side, port in ports.items()}
    base = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    tcmalloc = find_tcmalloc()
    if tcmalloc is None:
        sys.exit("tcmalloc not found (apt-get install libtcmalloc-minimal4): vLLM's CPU guide "
                 "preloads it, and so does tailguard serve")
    tailguard = [sys.executable, "-m", "tailguard", "serve", "--port", str(ports["tailguard"]),
                 "--db", str(tmp / "trace.duckdb")]
    if policies == "auto":
        tailguard += ["--slo", str(LOOSE_SLO)]
    vllm = vllm_command(model, ports["vllm"], engine_args)
    return {"vllm": (urls["vllm"], start(vllm, urls["vllm"], tmp / "vllm.log",
                                         dict(base, LD_PRELOAD=tcmalloc))),
            "tailguard": (urls["tailguard"],
                          start(tailguard + ["--", *engine_args], urls["tailguard"],
                                tmp / "tg.log", dict(base, TAILGUARD_ADMIN_TOKEN=TOKEN)))}


def admin(url: str, path: str, body: dict | None = None, method: str = "POST") -> dict:
    request = urllib.request.Request(
        url + path, json.dumps(body).encode() if body is not None else None, method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def settle(url: str):
    """What a run's CPU count ends with on tailguard: `POST /admin/flush`, every row of
    the run in DuckDB (the load otherwise comes once a minute, in whichever run)."""
    return lambda: admin(url, "/admin/flush")


def force_policies_off(url: str) -> None:
    for name in POLICIES:
        admin(url, f"/admin/policies/{name}", {"mode": "force_off", "reason": "vs_vllm"}, "PUT")


def stalls(url: str, prefix: str, latencies: list[float]) -> tuple[int, int]:
    """(requests with engine phases under 0.1 s, those of them over 0.15 s at the client)."""
    admin(url, "/admin/flush")
    data = admin(url, "/admin/query", {"sql": (
        "SELECT request_id, coalesce(tokenize_s, 0) + queue_s + prefill_s + decode_s "
        f"FROM requests WHERE request_id LIKE '{prefix}%' AND status = 'ok'")})
    phases = {rid: s for rid, s in data["rows"]}
    short = [(phases[f"{prefix}{i}"], e2e) for i, e2e in enumerate(latencies)
             if phases.get(f"{prefix}{i}") is not None and phases[f"{prefix}{i}"] < STALL_PHASES_S]
    return len(short), sum(e2e > STALL_E2E_S for _, e2e in short)


def loop_lag_buckets(url: str, metric: str = R.EVENT_LOOP_LAG.prom_name) -> dict[float, float]:
    """A server's event-loop lag histogram on /metrics (tailguard's own, or vLLM's
    probe): cumulative count per bound."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric + "_bucket":
                out[float(s.labels["le"])] = s.value
    return out


def lag_quantile(before: dict, after: dict, q: float) -> float | None:
    """The bound under which `q` of the samples taken between two reads fell."""
    delta = sorted((bound, after[bound] - before.get(bound, 0.0)) for bound in after)
    total = delta[-1][1] if delta else 0
    if not total:
        return None
    return next(bound for bound, count in delta if count >= q * total)


def one(side: str, running: dict, work: C.Workload, seed: int, tag: str) -> dict:
    url, process = running[side]
    prefix = f"{tag}-{side}-"
    metric = R.EVENT_LOOP_LAG.prom_name if side == "tailguard" else PROBE_METRIC
    lag_before = loop_lag_buckets(url, metric)
    out = C.run(url, process.pid, NAME, str(ensure_model()), work, seed, prefix,
                settle=settle(url) if side == "tailguard" else None)
    lag_after = loop_lag_buckets(url, metric)
    out["lag_p99_le"] = lag_quantile(lag_before, lag_after, 0.99)
    out["lag_max_le"] = lag_quantile(lag_before, lag_after, 1.0)
    if side == "tailguard" and work.name == "light":
        out["short"], out["stalled"] = stalls(url, prefix, out["latencies"])
    out.pop("latencies")
    return out


def rounds(running: dict, args) -> list[dict]:
    """A short warm-up of both workloads on both sides (dropped); then every round's
    light load, then every round's saturation, so no light run follows a saturated one."""
    light, sat = C.light(args.light_rate, args.light_prompts), C.saturate(
        args.concurrency, args.saturate_prompts)
    for side in SIDES:
        for work in (C.light(4.0, 8), C.saturate(args.concurrency, 2 * args.concurrency)):
            one(side, running, work, seed=0, tag="warmup")
    rows = [{"round": i, "first": SIDES[(i + 1) % 2]} for i in range(1, args.rounds + 1)]
    for work in (light, sat):
        for row in rows:
            order = SIDES if row["first"] == SIDES[0] else SIDES[::-1]
            row[f"loadavg_{work.name}"] = os.getloadavg()[0]
            for side in order:
                result = one(side, running, work, seed=row["round"], tag=f"r{row['round']}")
                row.setdefault(side, {})[work.name] = result
                print(json.dumps({"round": row["round"], "work": work.name, "side": side,
                                  **result}), flush=True)
    return rows


METRICS = (("CPU ms per request, saturation", "saturate", "cpu_ms", 1),
           ("CPU ms per request, light load", "light", "cpu_ms", 1),
           ("output tokens/s, saturation", "saturate", "output_tok_s", 1),
           ("requests/s, saturation", "saturate", "req_s", 1),
           ("TTFT p50, light (ms)", "light", "ttft_50", 1000),
           ("TTFT p99, light (ms)", "light", "ttft_99", 1000),
           ("TPOT p50, light (ms)", "light", "tpot_50", 1000),
           ("TPOT p99, light (ms)", "light", "tpot_99", 1000),
           ("E2E p99, light (ms)", "light", "e2el_99", 1000))


def report(rows: list[dict], args) -> None:
    print(f"\n{len(rows)} rounds; tailguard policies {args.policies}; engine args "
          f"{' '.join(args.engine_arg) or '(none)'}; light {args.light_rate:g} req/s x "
          f"{args.light_prompts}; saturation {args.concurrency} clients x "
          f"{args.saturate_prompts} requests\n")
    print("| round | first | " + " | ".join(f"{label}: vLLM / tailguard"
                                           for label, *_ in METRICS) + " | stalls |")
    print("|---|---|" + "---|" * (len(METRICS) + 1))
    for row in rows:
        cells = [f"{s * row['vllm'][w][k]:.2f} / {s * row['tailguard'][w][k]:.2f}"
                 for _, w, k, s in METRICS]
        light = row["tailguard"]["light"]
        print(f"| {row['round']} | {row['first']} | " + " | ".join(cells)
              + f" | {light['stalled']}/{light['short']} |")
    print("\n| metric | vLLM median | tailguard median | tailguard/vLLM per round: median "
          "[min-max] |\n|---|---:|---:|---:|")
    for label, work, key, scale in METRICS:
        ours = [row["tailguard"][work][key] for row in rows]
        theirs = [row["vllm"][work][key] for row in rows]
        ratios = [o / t for o, t in zip(ours, theirs)]
        print(f"| {label} | {scale * statistics.median(theirs):.2f} | "
              f"{scale * statistics.median(ours):.2f} | {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}] |")
    failed = {side: sum(row[side][w]["failed"] for row in rows for w in ("light", "saturate"))
              for side in SIDES}
    stalled = sum(row["tailguard"]["light"]["stalled"] for row in rows)
    short = sum(row["tailguard"]["light"]["short"] for row in rows)
    for work in ("light", "saturate"):
        for side in SIDES:
            p99 = [row[side][work]["lag_p99_le"] for row in rows]
            worst = [row[side][work]["lag_max_le"] for row in rows]
            print(f"{side} event-loop lag, {work}: p99 at or under (histogram bound, s) "
                  f"per round {p99}; largest sample under {worst}")
    print(f"\nfailed requests: {failed}; tailguard light-load stalls (engine phases < "
          f"{STALL_PHASES_S:g} s, client end to end > {STALL_E2E_S:g} s): {stalled} of "
          f"{short}")
    print("command: " + command_line(__spec__.name))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--saturate-prompts", type=int, default=320)
    ap.add_argument("--light-rate", type=float, default=1.0)
    ap.add_argument("--light-prompts", type=int, default=40)
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="a vLLM engine flag for both servers (repeat)")
    ap.add_argument("--policies", choices=("off", "auto"), default="off",
                    help="off: the degradation policies and batch-size controller forced "
                         "off through the admin API (everything else on); auto: left on, "
                         "under loose SLO targets")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        running = servers(Path(tmp), args.engine_arg, args.policies)
        try:
            if args.policies == "off":
                force_policies_off(running["tailguard"][0])
            rows = rounds(running, args)
        finally:
            for _, process in running.values():
                process.terminate()
                process.wait(timeout=60)
    report(rows, args)


if __name__ == "__main__":
    main()
