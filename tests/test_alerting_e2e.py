"""Alerts that reach a human, end to end with the real parts from Debian: Prometheus
scrapes a real `tailguard serve` every second with the rules generated for
`tests/data/slo_alerting.yaml`; an injected engine fault (every request delayed past
the TTFT target) burns the budget; the burn-rate page fires and Alertmanager, with the
shipped `alerts/alertmanager.example.yml` (its webhook URLs pointed at a receiver in
this test, its waits shortened), delivers it to the pager with the SLO's labels,
severity and runbook URL; once the fault clears and good traffic brings the burn under
the page factors, the page is delivered resolved and the ticket it inhibited reaches
the ticket queue. Loopback only, bounded in time."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from alerts.config import RuleConfig
from alerts.rules import write
from alerts.slo_rules import BURN_ALERT
from slo.loading import load_spec
from tests import conftest
from tests.prometheus_server import get, send_completions, until

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "tests" / "data" / "slo_alerting.yaml"
EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
RUNBOOKS = "https://runbooks.example/alerts.md"
JOB = "tailguard-alerting"
DEADLINE_S = 90


class Receiver:
    """A webhook receiver: every Alertmanager notification, by receiver path."""

    def __init__(self):
        self.got: list[tuple[str, dict]] = []
        received = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, path: str, status: str) -> list[dict]:
        return [a for p, note in self.got if p == path for a in note["alerts"]
                if a["status"] == status]


def _daemon(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=log.parent)


def alertmanager_config(receiver: Receiver) -> dict:
    """The shipped example, its webhooks pointed here and its waits cut to a second."""
    config = yaml.safe_load(EXAMPLE.read_text())
    for entry in config["receivers"]:
        for hook in entry["webhook_configs"]:
            hook["url"] = f"{receiver.url}/{entry['name']}"
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    return config


@pytest.fixture
def stack(tmp_path):
    """Server (fault injection on), Alertmanager, Prometheus and the receiver."""
    for exe in ("prometheus", "prometheus-alertmanager", "amtool"):
        assert shutil.which(exe), f"Debian's {exe} is needed (scripts/system-deps.sh)"
    receiver = Receiver()
    am_dir, prom_dir = tmp_path / "alertmanager", tmp_path / "prometheus"
    am_dir.mkdir(), prom_dir.mkdir()
    (am_dir / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(receiver)))
    am_url = f"http://127.0.0.1:{conftest.free_port()}"
    server = conftest.start_server(tmp_path, "--slo", str(SPEC), "--enable-fault-injection")
    processes = [_daemon(["prometheus-alertmanager", f"--config.file={am_dir / 'alertmanager.yml'}",
                          f"--storage.path={am_dir / 'data'}", "--cluster.listen-address=",
                          f"--web.listen-address={am_url.removeprefix('http://')}"],
                         am_dir / "alertmanager.log")]
    rules, _ = write(load_spec(SPEC), prom_dir / "rules",
                     RuleConfig(job=JOB, runbook_base=RUNBOOKS))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(rules)],
              "alerting": {"alertmanagers": [{"static_configs": [
                  {"targets": [am_url.removeprefix("http://")]}]}]},
              "scrape_configs": [{"job_name": JOB, "static_configs": [
                  {"targets": [server.url.removeprefix("http://")]}]}]}
    (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom_url = f"http://127.0.0.1:{conftest.free_port()}"
    processes.append(_daemon(
        ["prometheus", f"--config.file={prom_dir / 'prometheus.yml'}",
         f"--storage.tsdb.path={prom_dir / 'data'}",
         f"--web.listen-address={prom_url.removeprefix('http://')}"], prom_dir / "prometheus.log"))
    try:
        until(lambda: get(am_url + "/-/ready", raw=True) == 200, "Alertmanager ready", 30)
        until(lambda: get(prom_url + "/-/ready", raw=True) == 200, "Prometheus ready", 30)
        yield server, prom_url, receiver
    finally:
        for process in processes:
            conftest.stop_process(process)
        receiver.server.shutdown()
        conftest.stop_server(server)


def _fault(server, mode: str, delay_s: float = 0.0) -> None:
    request = urllib.request.Request(
        server.url + "/admin/faults", method="PUT",
        data=json.dumps({"mode": mode, "delay_s": delay_s}).encode(),
        headers={"Authorization": f"Bearer {conftest.ADMIN_TOKEN}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert json.loads(resp.read())["mode"] == mode


def _first(find: Callable[[], list[dict]], what: str) -> dict:
    return until(lambda: (found := find()) and found[0], what, DEADLINE_S)


def test_the_example_config_passes_amtool():
    done = subprocess.run(["amtool", "check-config", str(EXAMPLE)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_burning_budget_pages_a_human_and_resolves_when_the_fault_clears(stack):
    server, prom, receiver = stack
    until(lambda: get(f"{prom}/api/v1/targets") and all(
        t["health"] == "up" for t in get(f"{prom}/api/v1/targets")["data"]["activeTargets"]),
        "target up", 30)
    send_completions(server, 10, 0.05)  # on time: the budget is intact
    time.sleep(3)
    assert receiver.got == []
    _fault(server, "slow", 0.4)  # every first token 0.4 s late against 0.25 s
    send_completions(server, 12, 0.05)
    page = _first(lambda: receiver.alerts("/pager", "firing"), "the page delivered")
    assert page["labels"]["alertname"] == BURN_ALERT
    assert {k: page["labels"][k] for k in ("severity", "sloth_slo", "sloth_service")} == {
        "severity": "page", "sloth_slo": "ttft", "sloth_service": "tailguard"}
    assert page["annotations"]["runbook_url"] == f"{RUNBOOKS}#{BURN_ALERT.lower()}"
    assert receiver.alerts("/tickets", "firing") == []  # inhibited by the page
    _fault(server, "none")
    send_completions(server, 40, 0.05)  # 12 bad of 62: under the page factors, over a ticket's
    resolved = _first(lambda: receiver.alerts("/pager", "resolved"), "the page resolved")
    assert resolved["labels"]["severity"] == "page"
    ticket = _first(lambda: receiver.alerts("/tickets", "firing"), "the ticket delivered")
    assert (ticket["labels"]["severity"], ticket["labels"]["sloth_slo"]) == ("ticket", "ttft")
