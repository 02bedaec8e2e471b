"""Benchmark: right after a restart, does the burn-rate SLI Prometheus computes agree
with what the server counted? (issue 21 §4)

A counter series Prometheus first scrapes at a value above 0 hides that first
increment from `rate()` (Prometheus 2.42 ingests no created timestamps), so a series
born at a request's verdict loses it. For each checkout (A, then B): a fresh `tailguard
serve` (float32, its own trace log), Debian's Prometheus scraping it every second with
the rules generated for the tests' `slo_breach.yaml` (the shipped spec's SLOs and one
more), two scrapes of the idle server, then `--requests` completions from `--clients`
concurrent clients (prompts of 50-1,500 tokens, so some miss their TTFT target and most
do not), three more scrapes, and for every SLO with a bad event Prometheus'
`slo:sli_error:ratio_rate5m` against the exact share of bad verdicts the server counted
(`tailguard_slo_requests_total` on its `/metrics`).

    python -m bench.reliability.restart_sli A_TREE B_TREE [--requests 120] [--clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import command_line, machine
from bench.server_cpu.ab_checkouts import serve
from serving.engine.embedded_model import ensure_model
from tests.conftest import stop_process
from tests.prometheus_server import JOB, query, running_prometheus, until

RATIO = "slo:sli_error:ratio_rate5m"
COUNTER = re.compile(r'^tailguard_slo_requests_total\{(.*)\} (\S+)$')


async def load(url: str, requests: int, clients: int, seed: int) -> None:
    rng = random.Random(seed)
    words = "the quick brown fox jumps over a lazy dog while every engine step".split()
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(50, 1500)))
               for _ in range(requests)]
    queue = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]

        async def client():
            while not queue.empty():
                body = {"model": model, "prompt": queue.get_nowait(), "max_tokens": 8}
                status = (await http.post("/v1/completions", json=body)).status_code
                statuses[status] = statuses.get(status, 0) + 1  # a 429 is a verdict too

        statuses: dict[int, int] = {}
        await asyncio.gather(*(client() for _ in range(clients)))
        print(f"  HTTP statuses: {dict(sorted(statuses.items()))}")


def counted(url: str) -> dict[str, float]:
    """Each SLO's share of bad verdicts, from the server's own counters."""
    totals: dict[str, list[float]] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if match := COUNTER.match(line):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            bad_all = totals.setdefault(labels["slo"], [0.0, 0.0])
            bad_all[1] += float(match.group(2))
            if labels["result"] == "bad":
                bad_all[0] += float(match.group(2))
    return {slo: bad / every for slo, (bad, every) in totals.items() if every and bad}


def one_side(tree: Path, tmp: Path, requests: int, clients: int, seed: int) -> dict:
    url, process = serve(tree, tmp, policies_off=False)
    try:  # the rules of tests/data/slo_breach.yaml: the shipped spec's SLOs and one more
        with running_prometheus(type("S", (), {"url": url}), tmp / "prometheus") as prom:
            until(lambda: query(prom, f'count_over_time(up{{job="{JOB}"}}[1m])').get("", 0)
                  >= 2, "two scrapes of the idle server", 30)
            asyncio.run(load(url, requests, clients, seed))
            time.sleep(3.5)
            exact = counted(url)
            seen = query(prom, RATIO)
        return {slo: (share, seen.get(slo)) for slo, share in sorted(exact.items())}
    finally:
        stop_process(process, 60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs=2, type=Path, help="checkouts A and B")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=300)
    args = ap.parse_args()
    ensure_model()
    print(f"`{command_line('bench.reliability.restart_sli')}`; machine: {machine()}")
    print("| side | SLO | bad share the server counted | slo:sli_error:ratio_rate5m | "
          "Prometheus / counted |\n|---|---|---:|---:|---:|")
    for side, tree in zip("AB", args.trees):
        with tempfile.TemporaryDirectory() as tmp:
            rows = one_side(tree.resolve(), Path(tmp), args.requests, args.clients, args.seed)
        for slo, (exact, seen) in rows.items():
            shown = "-" if seen is None else f"{seen:.2%}"
            ratio = "-" if seen is None else f"{seen / exact:.3f}"
            print(f"| {side} | {slo} | {exact:.2%} | {shown} | {ratio} |")


if __name__ == "__main__":
    main()
