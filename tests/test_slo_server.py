"""The server judges each request against every SLO and reports budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN
from tests.test_serving import sample


def test_every_slo_gets_a_verdict_per_request(server, client, model_name, session_spec):
    before = server.metrics()
    out = client.completions.create(model=model_name, prompt="judge me", max_tokens=4)
    after = server.metrics()
    for slo in session_spec.slos:
        delta = sum(sample(after, "tailguard_slo_requests_total", slo=slo.name, result=r)
                    - sample(before, "tailguard_slo_requests_total", slo=slo.name, result=r)
                    for r in ("good", "bad"))
        assert delta == 1, slo.name
    row = server.sql("SELECT slo_ttft_target_s, slo_ok, ttft_s, tpot_s, e2e_s FROM requests "
                     f"WHERE request_id = '{out.id.removeprefix('cmpl-')}'")[0]
    assert row["slo_ttft_target_s"] == 0.2  # the spec's first TTFT SLO is the default's
    assert row["slo_ok"] is False  # nobody meets ttft_breach's 1 µs


def test_a_rejected_request_is_an_availability_event_only(server):
    before = server.metrics()
    httpx.post(server.url + "/v1/completions", content=b"{", timeout=10)
    after = server.metrics()
    good = "tailguard_slo_requests_total"
    assert sample(after, good, slo="availability", result="good") - \
        sample(before, good, slo="availability", result="good") == 1
    assert sample(after, good, slo="ttft") == sample(before, good, slo="ttft")


def test_admin_slo_and_the_cli_show_the_same_budgets(server, client, model_name, session_spec):
    client.completions.create(model=model_name, prompt="budget", max_tokens=2)
    req = urllib.request.Request(server.url + "/admin/slo",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        data = json.loads(resp.read())
    overall = {s["name"]: s for s in data["slos"] if not s["group"]}
    assert set(overall) == {s.name for s in session_spec.slos}
    assert overall["ttft"]["windows"][0]["window"] == "5m"
    assert overall["availability"]["windows"][-1]["events"] >= 1
    out = subprocess.run([sys.executable, "-m", "tailguard", "slo", "status", "--url", server.url],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TAILGUARD_ADMIN_TOKEN": ADMIN_TOKEN})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["slo", "group", "objective"]
    names = [s.name for s in session_spec.slos]
    assert [line.split()[0] for line in lines[1:1 + len(names)]] == names


def test_admin_slo_needs_the_token(server):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.url + "/admin/slo", timeout=10)
    assert err.value.code == 401
