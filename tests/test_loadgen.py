"""The load generator: reproducible open-loop workloads and a report from a real run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from loadgen.report import percentile
from loadgen.workload import CHAT_TOKENS, Workload


def _count(arrivals, lo, hi):
    return sum(lo <= a.at_s < hi for a in arrivals)


def test_the_same_seed_gives_the_same_workload():
    a = Workload("mixed", 5, 60, 1000, seed=3).arrivals()
    b = Workload("mixed", 5, 60, 1000, seed=3).arrivals()
    c = Workload("mixed", 5, 60, 1000, seed=4).arrivals()
    assert a == b and a != c


def test_steady_arrivals_average_the_rate():
    arrivals = Workload("steady", 10, 600, 100_000, seed=1).arrivals()
    assert len(arrivals) == pytest.approx(6000, rel=0.05)
    assert all(CHAT_TOKENS[0] <= a.prompt_words <= CHAT_TOKENS[1] for a in arrivals)


def test_a_burst_triples_the_rate_in_the_middle_third():
    arrivals = Workload("burst", 10, 300, 100_000, seed=2).arrivals()
    assert _count(arrivals, 100, 200) / _count(arrivals, 0, 100) == pytest.approx(3, rel=0.15)


def test_a_ramp_rises_from_zero():
    arrivals = Workload("ramp", 20, 300, 100_000, seed=5).arrivals()
    thirds = [_count(arrivals, 100 * i, 100 * (i + 1)) for i in range(3)]
    assert thirds[0] < thirds[1] < thirds[2]
    assert thirds[2] / thirds[0] == pytest.approx(5, rel=0.25)  # mean rates 1/6 : 5/6


def test_mixed_traffic_is_bimodal_up_to_the_context():
    arrivals = Workload("mixed", 10, 600, 100_000, max_context=4096, seed=6).arrivals()
    documents = [a for a in arrivals if a.prompt_words > CHAT_TOKENS[1]]
    assert len(documents) / len(arrivals) == pytest.approx(0.3 * 0.99, abs=0.04)
    assert max(a.prompt_words for a in arrivals) <= 4096 - 64


def test_runs_are_bounded_in_count_and_time():
    arrivals = Workload("steady", 100, 10, 25, seed=1).arrivals()
    assert len(arrivals) == 25 and arrivals[-1].at_s < 10


@pytest.mark.parametrize("values,p,expected", [
    ([1, 2, 3, 4], 50, 2.5), ([1, 2, 3, 4], 0, 1), ([1, 2, 3, 4], 100, 4),
    ([10], 99, 10), ([], 50, None), (list(range(101)), 99, 99)])
def test_percentiles_interpolate_like_numpy(values, p, expected):
    assert percentile(values, p) == expected


@pytest.mark.parametrize("kwargs", [{"scenario": "chaos"}, {"rate": 0}, {"max_requests": 0}])
def test_bad_workloads_are_refused(kwargs):
    base = {"scenario": "steady", "rate": 1, "duration_s": 1, "max_requests": 1}
    with pytest.raises(ValueError):
        Workload(**{**base, **kwargs})


def test_a_bench_run_against_the_server_reports_every_request(server, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tailguard", "bench", "--url", server.url, "--scenario", "mixed",
         "--rate", "4", "--duration", "3", "--max-requests", "8", "--output-tokens", "8",
         "--seed", "1", "--out", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "bench.json").read_text())
    summary, results = report["summary"], report["results"]
    assert summary["requests"] == len(results) == 8
    assert summary["ok"] == 8 and summary["errors"] == {}
    assert all(r["output_tokens"] == 8 and r["ttft_s"] <= r["e2e_s"] for r in results)
    assert summary["latency"]["all"]["count"] == 8
    assert (tmp_path / "bench.png").stat().st_size > 1000
    assert "throughput" in out.stdout


def test_bench_refuses_an_unreachable_server():
    out = subprocess.run([sys.executable, "-m", "tailguard", "bench", "--url",
                          "http://127.0.0.1:9", "--duration", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
