"""Debian's Prometheus scraping a real tailguard server, with the rules generated for
`tests/data/slo_breach.yaml`, and the small HTTP helpers that read it: shared by the
Prometheus, Alertmanager and native-histogram tests and by `bench.reliability`."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from alerts.config import RuleConfig
from alerts.rules import write
from slo.loading import load_spec
from tests.conftest import free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
BREACH_SPEC = ROOT / "tests" / "data" / "slo_breach.yaml"
JOB = "tailguard-e2e"
REQUESTS = 20


@contextlib.contextmanager
def running_prometheus(server, tmp: Path, native: bool = False):
    """Debian's Prometheus scraping `server` every second with the breach spec's rules;
    `native`: with its native-histograms feature (it then asks for the protobuf format)."""
    exe = shutil.which("prometheus")
    assert exe, "Debian's prometheus package is needed (scripts/system-deps.sh)"
    tmp.mkdir(parents=True, exist_ok=True)
    rules, _ = write(load_spec(BREACH_SPEC), tmp / "rules", RuleConfig(job=JOB))
    target = server.url.removeprefix("http://")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(rules)],
              "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    log = (tmp / "prometheus.log").open("w")
    process = subprocess.Popen(
        [exe, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address={url.removeprefix('http://')}",
         *(["--enable-feature=native-histograms"] if native else [])],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        until(lambda: get(url + "/-/ready", raw=True) == 200, "Prometheus ready", 30)
        yield url
    finally:
        stop_process(process)
        log.close()


def get(url: str, raw: bool = False):
    """The JSON at `url` (`raw`: its HTTP status), None when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status if raw else json.loads(resp.read())
    except OSError:
        return None


def until(check, what: str, timeout_s: float):
    """`check()`'s first truthy result, polled every 0.5 s for `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s}s")


def query(url: str, promql: str) -> dict[str, float]:
    """{sloth_slo or '': value} of an instant query."""
    data = get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if not data or data.get("status") != "success":
        return {}
    return {r["metric"].get("sloth_slo", ""): float(r["value"][1]) for r in data["data"]["result"]}


def send_completions(server, count: int = REQUESTS, pause_s: float = 0.25) -> None:
    """`count` short completions, each answered 200, spread over a few scrapes (with the
    default pause) so that the counters rise between samples."""
    model = get(server.url + "/v1/models")["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "The quick brown fox", "max_tokens": 4}).encode()
    for _ in range(count):
        req = urllib.request.Request(server.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
        time.sleep(pause_s)
