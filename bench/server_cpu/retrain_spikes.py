"""What the latency predictor's retrain costs the server: one `tailguard serve` alone
(policies forced off), retraining every `--retrain-s` seconds instead of 600, drives
`--batches` closed-loop batches of 320 short requests (vLLM's benchmark client, 16
clients) and prints the server process's CPU a request per batch, and its reaped
children's: a fit of the four quantile models (about 6 s of CPU on a 2-vCPU machine)
stood out in the server's own figure until 37955d8 and lands in the children's since
(`slo/predict/fit_process.py`). Then the server log's retrain decisions.

    python -m bench.server_cpu.retrain_spikes --retrain-s 75 --batches 6
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.server_cpu.thread_cpu import command
from bench.serving import vllm_client as C
from bench.serving.vs_vllm import NAME, _free_port, force_policies_off, start
from serving.engine.embedded_model import ensure_model

BATCH = 320


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retrain-s", type=float, default=75.0)
    ap.add_argument("--batches", type=int, default=6)
    args = ap.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        cmd, env = command("tailguard", port, tmp)
        env["TAILGUARD_RETRAIN_S"] = f"{args.retrain_s:g}"
        log = Path(tmp) / "server.log"
        server = start(cmd, url, log, env)
        try:
            force_policies_off(url)
            model = str(ensure_model())
            for i in range(args.batches):
                before, children = C.process_cpu_s(server.pid), C.children_cpu_s(server.pid)
                done = C.run(url, server.pid, NAME, model, C.saturate(16, BATCH), i,
                             f"b{i}-")["completed"]
                spent = C.process_cpu_s(server.pid) - before
                apart = C.children_cpu_s(server.pid) - children
                print(f"batch {i}: {1000 * spent / done:.2f} ms of CPU a request, "
                      f"{1000 * apart / done:.2f} in reaped children", flush=True)
        finally:
            server.terminate()
            server.wait()
        print("".join(line for line in log.read_text().splitlines(keepends=True)
                      if "latency model" in line))


if __name__ == "__main__":
    main()
