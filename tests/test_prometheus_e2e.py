"""End to end: Debian's Prometheus scrapes a real tailguard server every second and
evaluates the rules generated for `tests/data/slo_breach.yaml`, whose `ttft_breach`
SLO (a 1 us TTFT target) makes every request a bad event; a handful of requests
must make its SLI 100% and its page alert fire. Loopback only, bounded in time."""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.ops_rules import OPS_ALERTS
from alerts.slo_rules import BURN_ALERT
from observe import registry as R
from slo.histogram_bounds import latency_buckets
from slo.loading import load_spec
from tests import conftest
from tests.prometheus_server import (
    BREACH_SPEC,
    JOB,
    get,
    query,
    running_prometheus,
    send_completions,
    until,
)

BREACH_SLO, GOOD_SLO = "ttft_breach", "availability"
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


def _firing(url: str) -> set[tuple[str, str]]:
    """(sloth_slo, severity) of the firing burn-rate alerts."""
    data = get(url + "/api/v1/alerts") or {"data": {"alerts": []}}
    return {(a["labels"].get("sloth_slo"), a["labels"].get("severity"))
            for a in data["data"]["alerts"]
            if a["labels"].get("alertname") == BURN_ALERT and a["state"] == "firing"}



def test_a_breached_slo_pages_through_a_real_prometheus(breach_server, prometheus):
    until(lambda: query(prometheus, f'up{{job="{JOB}"}}').get("") == 1, "target up", 20)
    send_completions(breach_server)
    ratio = "slo:sli_error:ratio_rate5m"
    sli = until(lambda: (s := query(prometheus, ratio)).get(BREACH_SLO) and s,
                f"{ratio} for {BREACH_SLO}", DEADLINE_S)
    assert sli[BREACH_SLO] == 1.0  # every request missed the 1 us target
    assert sli[GOOD_SLO] == 0.0  # no `bad` series at all still reads as 0
    firing = until(lambda: _firing(prometheus) >= {(BREACH_SLO, "page")} and _firing(prometheus),
                   f"page alert for {BREACH_SLO}", DEADLINE_S)
    assert (GOOD_SLO, "page") not in firing
    burn = query(prometheus, f'slo:current_burn_rate:ratio{{sloth_slo="{BREACH_SLO}"}}')
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
            until(lambda: query(prom, f"count_over_time({bad}[1m])").get("", 0) >= 2,
                  "two scrapes of the zero series", 30)
            send_completions(fresh, 1, 0)
            ratio = "slo:sli_error:ratio_rate5m"
            sli = until(lambda: (s := query(prom, ratio)).get(BREACH_SLO) and s,
                        f"{ratio} for {BREACH_SLO} after one request", 30)
            assert sli[BREACH_SLO] == 1.0
            # the slo bounds (--histogram-buckets slo): exactly those, and the P99 the
            # operational alert computes from them
            ttft = 'gen_ai_server_time_to_first_token_seconds_bucket{context_bucket="0-1k"}'
            bounds = latency_buckets(load_spec(BREACH_SPEC), "slo")[R.TTFT.prom_name]
            assert query(prom, f"count({ttft})")[""] == len(bounds) + 1
            send_completions(fresh, 1, 0)  # a rise for rate() to see
            e2e = "histogram_quantile(0.99, sum by (le) (rate(" \
                  f'gen_ai_server_request_duration_seconds_bucket{{job="{JOB}"}}[2m])))'
            p99 = until(lambda: (q := query(prom, e2e).get("")) and q == q and q,  # not NaN
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
        until(lambda: query(prom, f'up{{job="{JOB}"}}').get("") == 1, "protobuf scrape", 20)
        assert query(prom, 'count({__name__=~"vllm:.+"})')[""] > 10
        counts = [line for line in server.metrics().splitlines()
                  if line.startswith(R.TTFT.prom_name + "_count{") and '"0-1k"' in line]
        text_count = float(counts[0].rsplit(" ", 1)[1])
        native = f'histogram_count({R.TTFT.prom_name}{{context_bucket="0-1k"}})'
        until(lambda: query(prom, native).get("") == text_count, "the native count", 20)
        assert query(prom, f"count({R.TTFT.prom_name}_bucket)") == {}
        send_completions(server, 2, 1.5)  # rises over two scrapes, for rate()
        alert = next(a for a in OPS_ALERTS if a.name == "TailguardHighP99Latency")
        p99 = alert.expr(JOB).split(" > ")[0]  # the operational alert's, both forms in it
        native_p99 = until(lambda: (q := query(prom, p99).get("")) and q == q and q,
                           "a P99 from the native histogram", 30)
        assert 0 < native_p99 < 60 and classic_p99 > 0
