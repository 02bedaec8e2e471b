"""End to end: Debian's Prometheus scrapes a real tailguard server every second and
evaluates the rules generated for `tests/data/slo_breach.yaml`, whose `ttft_breach`
SLO (a 1 us TTFT target) makes every request a bad event; a handful of requests
must make its SLI 100% and its page alert fire. Loopback only, bounded in time."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from alerts.config import RuleConfig
from alerts.ops_rules import OPS_ALERTS
from alerts.rules import write
from alerts.slo_rules import BURN_ALERT
from observe import registry as R
from slo.histogram_bounds import latency_buckets
from slo.loading import load_spec
from tests import conftest

ROOT = Path(__file__).resolve().parent.parent
BREACH_SPEC = ROOT / "tests" / "data" / "slo_breach.yaml"
BREACH_SLO, GOOD_SLO = "ttft_breach", "availability"
JOB = "tailguard-e2e"
REQUESTS = 20
DEADLINE_S = 60


@pytest.fixture(scope="module")
def breach_server(server):
    """The session server: conftest starts it with the breach spec."""
    assert conftest.SESSION_SLO == BREACH_SPEC
    return server


@pytest.fixture(scope="module")
def prometheus(breach_server, tmp_path_factory):
    with running_prometheus(breach_server, tmp_path_factory.mktemp("prometheus")) as url:
        yield url


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
    url = f"http://127.0.0.1:{conftest.free_port()}"
    log = (tmp / "prometheus.log").open("w")
    process = subprocess.Popen(
        [exe, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address={url.removeprefix('http://')}",
         *(["--enable-feature=native-histograms"] if native else [])],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    try:
        _until(lambda: _get(url + "/-/ready", raw=True) == 200, "Prometheus ready", 30)
        yield url
    finally:
        conftest.stop_process(process)
        log.close()


def _get(url: str, raw: bool = False):
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status if raw else json.loads(resp.read())
    except OSError:
        return None


def _until(check, what: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout_s}s")


def _query(url: str, promql: str) -> dict[str, float]:
    """{sloth_slo or '': value} of an instant query."""
    data = _get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    if not data or data.get("status") != "success":
        return {}
    return {r["metric"].get("sloth_slo", ""): float(r["value"][1]) for r in data["data"]["result"]}


def _firing(url: str) -> set[tuple[str, str]]:
    """(sloth_slo, severity) of the firing burn-rate alerts."""
    data = _get(url + "/api/v1/alerts") or {"data": {"alerts": []}}
    return {(a["labels"].get("sloth_slo"), a["labels"].get("severity"))
            for a in data["data"]["alerts"]
            if a["labels"].get("alertname") == BURN_ALERT and a["state"] == "firing"}


def send_completions(server, count: int = REQUESTS, pause_s: float = 0.25) -> None:
    """`count` short completions, each answered 200, spread over a few scrapes (with the
    default pause) so that the counters rise between samples."""
    model = _get(server.url + "/v1/models")["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "The quick brown fox", "max_tokens": 4}).encode()
    for _ in range(count):
        req = urllib.request.Request(server.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
        time.sleep(pause_s)


def test_a_breached_slo_pages_through_a_real_prometheus(breach_server, prometheus):
    _until(lambda: _query(prometheus, f'up{{job="{JOB}"}}').get("") == 1, "target up", 20)
    send_completions(breach_server)
    ratio = "slo:sli_error:ratio_rate5m"
    sli = _until(lambda: (s := _query(prometheus, ratio)).get(BREACH_SLO) and s,
                 f"{ratio} for {BREACH_SLO}", DEADLINE_S)
    assert sli[BREACH_SLO] == 1.0  # every request missed the 1 us target
    assert sli[GOOD_SLO] == 0.0  # no `bad` series at all still reads as 0
    firing = _until(lambda: _firing(prometheus) >= {(BREACH_SLO, "page")} and _firing(prometheus),
                    f"page alert for {BREACH_SLO}", DEADLINE_S)
    assert (GOOD_SLO, "page") not in firing
    burn = _query(prometheus, f'slo:current_burn_rate:ratio{{sloth_slo="{BREACH_SLO}"}}')
    assert burn[BREACH_SLO] == pytest.approx(100.0)  # 100% bad / 1% budget


def test_the_first_bad_request_after_a_restart_shows_in_the_error_ratio(tmp_path):
    """A server just started: its `bad` series must already be scraped at 0, or the
    first miss (0 -> 1) would be a series born at 1, which `rate()` cannot see."""
    fresh = conftest.start_server(tmp_path, "--slo", str(BREACH_SPEC),
                                  "--histogram-buckets", "slo", "--native-histograms")
    try:
        with running_prometheus(fresh, tmp_path / "prometheus") as prom:
            bad = (f'tailguard_slo_requests_total{{slo="{BREACH_SLO}",result="bad",'
                   'context_bucket="0-1k"}')
            _until(lambda: _query(prom, f"count_over_time({bad}[1m])").get("", 0) >= 2,
                   "two scrapes of the zero series", 30)
            send_completions(fresh, 1, 0)
            ratio = "slo:sli_error:ratio_rate5m"
            sli = _until(lambda: (s := _query(prom, ratio)).get(BREACH_SLO) and s,
                         f"{ratio} for {BREACH_SLO} after one request", 30)
            assert sli[BREACH_SLO] == 1.0
            # the slo bounds (--histogram-buckets slo): exactly those, and the P99 the
            # operational alert computes from them
            ttft = 'gen_ai_server_time_to_first_token_seconds_bucket{context_bucket="0-1k"}'
            bounds = latency_buckets(load_spec(BREACH_SPEC), "slo")[R.TTFT.prom_name]
            assert _query(prom, f"count({ttft})")[""] == len(bounds) + 1
            send_completions(fresh, 1, 0)  # a rise for rate() to see
            e2e = "histogram_quantile(0.99, sum by (le) (rate(" \
                  f'gen_ai_server_request_duration_seconds_bucket{{job="{JOB}"}}[2m])))'
            p99 = _until(lambda: (q := _query(prom, e2e).get("")) and q == q and q,  # not NaN
                         "a P99 from the slo bounds", 30)
            assert 0 < p99 < 60
        native_histograms_from_the_real_server(fresh, tmp_path / "prometheus-native", p99)
    finally:
        conftest.stop_server(fresh)


def native_histograms_from_the_real_server(server, tmp: Path, classic_p99: float) -> None:
    """The same server (`--native-histograms`) to a Prometheus with native histograms
    on: it asks for protobuf, must parse every family (vLLM's `vllm:*` too, or `up` is
    0), and reads the latency histograms as native ones with the text's counts."""
    with running_prometheus(server, tmp, native=True) as prom:
        _until(lambda: _query(prom, f'up{{job="{JOB}"}}').get("") == 1, "protobuf scrape", 20)
        assert _query(prom, 'count({__name__=~"vllm:.+"})')[""] > 10
        counts = [line for line in server.metrics().splitlines()
                  if line.startswith(R.TTFT.prom_name + "_count{") and '"0-1k"' in line]
        text_count = float(counts[0].rsplit(" ", 1)[1])
        native = f'histogram_count({R.TTFT.prom_name}{{context_bucket="0-1k"}})'
        _until(lambda: _query(prom, native).get("") == text_count, "the native count", 20)
        assert _query(prom, f"count({R.TTFT.prom_name}_bucket)") == {}
        send_completions(server, 2, 1.5)  # rises over two scrapes, for rate()
        alert = next(a for a in OPS_ALERTS if a.name == "TailguardHighP99Latency")
        p99 = alert.expr(JOB).split(" > ")[0]  # the operational alert's, both forms in it
        native_p99 = _until(lambda: (q := _query(prom, p99).get("")) and q == q and q,
                            "a P99 from the native histogram", 30)
        assert 0 < native_p99 < 60 and classic_p99 > 0
