"""Benchmark: engine crash -> served again, with the server's own breakdown.

One tailguard server on the embedded model. Each round starts a long completion,
SIGKILLs vLLM's engine core while it decodes (light load: one request in flight),
then asks for a 4-token completion every 0.2 s until one is served. Reported per
round: when the client in flight got its 503, when breaker L2 tripped and began the
restart (its `policy_events` rows), the server's own timings for the old engine's
shutdown, the new engine's start and warm-up (its log), and fault -> first request
served.

    python -m bench.reliability.recovery --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import psutil

from tests.conftest import start_server, stop_server

UP = re.compile(r"engine up in ([\d.]+) s: start ([\d.]+) s, warm-up ([\d.]+) s, "
                r"serving objects ([\d.]+) s")
RESTARTED = re.compile(r"engine restarted in ([\d.]+) s \(old engine shut down in ([\d.]+) s\)")


def engine_core(server) -> psutil.Process:
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if "EngineCor" in proc.name() or "EngineCore" in " ".join(proc.cmdline()):
                return proc
        except psutil.Error:
            continue
    raise RuntimeError("no engine core under the server")


def complete(server, model: str, max_tokens: int, timeout: float = 60) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=timeout,
                      json={"model": model, "prompt": "word " * 10, "max_tokens": max_tokens,
                            "ignore_eos": True})


def l2_events(server, since: float) -> dict:
    """Epoch seconds of breaker L2's trip and its restart event after `since`."""
    rows = server.sql("SELECT ts, to_state, reason FROM policy_events "
                      "WHERE policy = 'breaker_l2' ORDER BY ts")
    found = {}
    for row in rows:
        at = row["ts"]
        at = at.timestamp() if isinstance(at, datetime) else datetime.fromisoformat(
            str(at)).timestamp()
        if at < since - 1:
            continue
        if row["to_state"] == "active" and row["reason"] == "engine failed":
            found.setdefault("tripped", at)
        if row["reason"] == "restarting the engine":
            found.setdefault("restart", at)
    return found


def one_round(server, model: str, log_from: int) -> dict:
    core = engine_core(server)
    victim: dict = {}

    def in_flight() -> None:
        resp = complete(server, model, 3900)
        victim.update(status=resp.status_code, at=time.time())

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(2.0)  # decoding by now
    os.kill(core.pid, signal.SIGKILL)
    killed = time.time()
    served = None
    while served is None:
        try:
            if complete(server, model, 4, timeout=30).status_code == 200:
                served = time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
        if time.time() - killed > 180:
            raise RuntimeError("the engine did not come back in 180 s")
    thread.join()
    events = l2_events(server, killed)
    text = server.log.read_text()[log_from:]
    up, restarted = UP.findall(text), RESTARTED.findall(text)
    return {
        "in_flight_503_s": round(victim["at"] - killed, 2), "in_flight_status": victim["status"],
        "l2_tripped_s": round(events.get("tripped", float("nan")) - killed, 2),
        "restart_began_s": round(events.get("restart", float("nan")) - killed, 2),
        "shutdown_s": float(restarted[-1][1]) if restarted else None,
        "start_s": float(up[-1][1]) if up else None,
        "warmup_s": float(up[-1][2]) if up else None,
        "serving_objects_s": float(up[-1][3]) if up else None,
        "restart_total_s": float(restarted[-1][0]) if restarted else None,
        "fault_to_served_s": round(served - killed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = start_server(Path(tempfile.mkdtemp(prefix="tailguard-recovery-")))
    try:
        first = UP.findall(server.log.read_text())
        print(json.dumps({"first_start": first[-1] if first else None}))
        model = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        for _ in range(args.rounds):
            mark = len(server.log.read_text())
            print(json.dumps(one_round(server, model, mark)), flush=True)
            time.sleep(5)  # the restarted engine settles before the next fault
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
