"""The surge benchmark's server: one tailguard server on the embedded model with realtime,
VIP and batch keys, driven through its admin API (policy modes, faults, trace-log
queries) and by the load generator, split over the three keys."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import httpx

from bench.common import start_tailguard
from loadgen.runner import Target, run
from loadgen.workload import Workload

KEYS = {"realtime": ("sk-bench-rt", 0.6), "vip": ("sk-bench-vip", 0.1),
        "batch": ("sk-bench-batch", 0.3)}
KEYS_YAML = """keys:
  - {name: rt, key: sk-bench-rt, tier: realtime}
  - {name: vip, key: sk-bench-vip, tier: realtime, vip: true}
  - {name: bulk, key: sk-bench-batch, tier: batch}
"""
TOKEN = "bench-admin-token"
POLICIES = ("breaker_l1", "breaker_l2", "token_cap", "vip_only", "memory_pressure",
            "truncation", "predicted_miss", "batch_control")


def start(tmp: Path, port: int, latency_model: str | None,
          engine_args: tuple[str, ...] = (), policies: str | None = None,
          checkout: Path | None = None) -> subprocess.Popen:
    """`engine_args`: more vLLM engine arguments (e.g. `--dtype float32`); `policies`:
    a policy settings file (`tailguard serve --policies`); `checkout`: a source tree to
    serve from (another commit's, for an A/B of code; default: this one)."""
    (tmp / "keys.yaml").write_text(KEYS_YAML)
    if latency_model:  # what the server would have learnt from earlier traffic
        (tmp / "models").mkdir()
        shutil.copy(latency_model, tmp / "models" / "latency.pkl")
    serve = ["--db", str(tmp / "trace.duckdb"), "--keys", str(tmp / "keys.yaml"),
             "--enable-fault-injection", "--retrain-interval", "0",
             "--model-dir", str(tmp / "models"),
             *(["--policies", policies] if policies else []),
             "--", "--kv-cache-memory-bytes", str(48 * 1024 * 1024), *engine_args]
    env = {**os.environ, "TAILGUARD_ADMIN_TOKEN": TOKEN}
    return start_tailguard(port, serve, tmp / "server.log", env, cwd=checkout)


def admin(url: str, method: str, path: str, body: dict | None = None) -> dict:
    resp = httpx.request(method, url + path, json=body, timeout=30,
                         headers={"Authorization": f"Bearer {TOKEN}"})
    resp.raise_for_status()
    return resp.json()


def set_policies(url: str, mode: str) -> None:
    for name in POLICIES:
        admin(url, "PUT", f"/admin/policies/{name}", {"mode": mode, "reason": "benchmark side"})


async def drive(url: str, scenario: str, rate: float, duration: float, seed: int,
                surge_factor: float = 3.0, retry_refused: bool = True) -> dict:
    """Run one workload split over the three keys; results per key. A request refused
    with 429 is sent once more after its Retry-After (`Result.retry`)."""
    runs = {}
    for i, (kind, (key, share)) in enumerate(KEYS.items()):
        workload = Workload(scenario, rate * share, duration, 100_000, seed=seed * 10 + i,
                            surge_factor=surge_factor)
        runs[kind] = run(Target(url, "tailguard-tiny-llama", key, timeout_s=120, drain_s=60,
                                retry_refused=retry_refused), workload)
    results = await asyncio.gather(*runs.values())
    return dict(zip(runs, results))


_SECONDS = ("ttft_s", "slo_ttft_target_s", "estimated_ttft_s", "predicted_ttft_s",
            "predicted_ttft_p90_s")
ROWS_SQL = """
SELECT priority, vip, status, ttft_s, slo_ttft_target_s, policy_actions, estimated_ttft_s,
       predicted_ttft_s, predicted_ttft_p90_s
FROM requests WHERE epoch(arrival_ts) BETWEEN {start} AND {end}
"""


def server_rows(url: str, start: float, end: float) -> list[dict]:
    """The trace-log rows of the requests that arrived between `start` and `end`."""
    admin(url, "POST", "/admin/flush")
    data = admin(url, "POST", "/admin/query",
                 {"sql": ROWS_SQL.format(start=start, end=end), "max_rows": 100_000})
    if data.get("truncated"):
        raise RuntimeError("more trace-log rows than one query answers")
    rows = [dict(zip(data["columns"], row)) for row in data["rows"]]
    for row in rows:  # the API sends a non-finite double as a string (JSON has none)
        for name in _SECONDS:
            if isinstance(row[name], str):
                row[name] = float(row[name])  # "Infinity": a request that never fits
    return rows


BUSY_SQL = """
SELECT sum(least(1.0, mean_step_s * steps)) / count(*) AS busy FROM engine_stats
WHERE epoch(ts) BETWEEN {start} AND {end}
"""


def engine_busy(url: str, start: float, end: float) -> float | None:
    """The share of the seconds between `start` and `end` the engine spent stepping
    (its once-a-second `engine_stats` rows). Over the base phase before a surge it
    says whether the base rate was one this machine keeps up with: a base near 100%
    busy leaves the surge nothing a policy could win back (on a machine 4x slower, the
    same base rate was)."""
    admin(url, "POST", "/admin/flush")
    data = admin(url, "POST", "/admin/query", {"sql": BUSY_SQL.format(start=start, end=end)})
    busy = data["rows"][0][0] if data["rows"] else None
    return None if busy is None else float(busy)
