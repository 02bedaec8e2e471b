"""Seed 001's hot and cold paths as two real servers behind Debian's nginx on loopback:
`tailguard nginx` routes realtime keys to the hot instance and batch keys (or a request
lowered with X-Tailguard-Priority: batch) to the cold one, streams pass through, each
instance keeps its profile's bounds (batches of 4 and a 500 ms wait on the hot path,
batches of 16 and 64 waiting on the cold), and the fleet reads as one in the Parquet
archive (`tailguard query --archive`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, free_port, start_server, stop_process, stop_server

KEYS = """keys:
  - {name: chat, key: sk-hot-chat, tier: realtime}
  - {name: vip, key: sk-hot-vip, tier: realtime, vip: true}
  - {name: bulk, key: sk-cold-bulk, tier: batch}
"""
NGINX_MAIN = """daemon off;
master_process off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/nginx-access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/tailguard.conf;
}}
"""
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _nginx() -> str:
    found = shutil.which("nginx") or shutil.which("/usr/sbin/nginx")
    assert found, "nginx is missing: scripts/system-deps.sh installs Debian's nginx"
    return found


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paths")
    (tmp / "keys.yaml").write_text(KEYS)
    archive = tmp / "archive"
    servers = {}
    try:
        for side in ("hot", "cold"):
            (tmp / side).mkdir()
            servers[side] = start_server(
                tmp / side, "--path-profile", side, "--keys", str(tmp / "keys.yaml"),
                "--archive-dir", str(archive), "--instance", side,
                "--retrain-interval", "0", "--reselect-interval", "0")
        port = free_port()
        out = subprocess.run(
            [sys.executable, "-m", "tailguard", "nginx", "--keys", str(tmp / "keys.yaml"),
             "--hot", servers["hot"].url.removeprefix("http://"),
             "--cold", servers["cold"].url.removeprefix("http://"),
             "--listen", f"127.0.0.1:{port}", "--out", str(tmp / "tailguard.conf")],
            capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        (tmp / "nginx.conf").write_text(NGINX_MAIN.format(tmp=tmp))
        proxy = subprocess.Popen([_nginx(), "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        _wait_listening(url, proxy)
        yield {"url": url, "archive": archive, "tmp": tmp, **servers}
        stop_process(proxy)
    finally:
        for srv in servers.values():
            stop_server(srv)


def _wait_listening(url: str, proxy: subprocess.Popen) -> None:
    for _ in range(100):
        if proxy.poll() is not None:
            raise RuntimeError(f"nginx exited: {proxy.stderr.read().decode()[-2000:]}")
        try:
            httpx.get(url + "/healthz", timeout=2)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("nginx did not listen within 10 s")


def _complete(url: str, key: str, headers: dict | None = None, stream: bool = False):
    return httpx.post(url + "/v1/completions", timeout=120, headers={
        "Authorization": f"Bearer {key}", **(headers or {})}, json={
        "model": "tailguard-tiny-llama", "prompt": "route me", "max_tokens": 4,
        "stream": stream})


def _landed(srv, request_id: str) -> list[dict]:
    return srv.sql(f"SELECT client, priority FROM requests WHERE request_id = '{request_id}'")


@pytest.mark.parametrize("key,headers,side,client,priority", [
    ("sk-hot-chat", {}, "hot", "chat", "realtime"),
    ("sk-hot-vip", {}, "hot", "vip", "realtime"),
    ("sk-cold-bulk", {}, "cold", "bulk", "batch"),
    ("sk-hot-chat", {"X-Tailguard-Priority": "batch"}, "cold", "chat", "batch"),
    ("sk-cold-bulk", {"X-Tailguard-Priority": "realtime"}, "cold", "bulk", "batch"),
])
def test_nginx_routes_each_key_to_its_tiers_path(paths, key, headers, side, client, priority):
    resp = _complete(paths["url"], key, headers)
    assert resp.status_code == 200, resp.text
    other = paths["cold" if side == "hot" else "hot"]
    rid = resp.headers["x-request-id"]
    assert _landed(paths[side], rid) == [{"client": client, "priority": priority}]
    assert _landed(other, rid) == []


def test_an_unknown_key_gets_the_servers_401_through_the_proxy(paths):
    resp = _complete(paths["url"], "sk-nobody")
    assert resp.status_code == 401 and resp.json()["error"]["message"]


def test_a_stream_passes_through_the_proxy_chunk_by_chunk(paths):
    chunks = []
    with httpx.stream("POST", paths["url"] + "/v1/completions", timeout=120, headers={
            "Authorization": "Bearer sk-hot-chat"}, json={
            "model": "tailguard-tiny-llama", "prompt": "stream me", "max_tokens": 8,
            "stream": True, "ignore_eos": True}) as resp:
        assert resp.status_code == 200
        chunks = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]" and len(chunks) >= 9


def test_each_instance_runs_its_profile(paths):
    hot = httpx.get(paths["hot"].url + "/admin/policies", headers=ADMIN, timeout=30).json()
    cold = httpx.get(paths["cold"].url + "/admin/policies", headers=ADMIN, timeout=30).json()
    assert (hot["limiter"]["limit"], hot["limiter"]["max_wait_s"],
            hot["limiter"]["max_queue"]) == (4, 0.5, 0)
    assert (cold["limiter"]["limit"], cold["limiter"]["max_wait_s"],
            cold["limiter"]["max_queue"]) == (16, 120.0, 64)


def test_the_hot_engine_batches_at_most_four_even_for_vips(paths):
    """VIPs pass the limiter at once: what bounds them is vLLM's own --max-num-seqs 4."""
    async def eight():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(
                paths["url"] + "/v1/completions", headers={"Authorization": "Bearer sk-hot-vip"},
                json={"model": "tailguard-tiny-llama", "prompt": f"vip {i}", "max_tokens": 24,
                      "ignore_eos": True}) for i in range(8)))
    assert [r.status_code for r in asyncio.run(eight())] == [200] * 8
    time.sleep(1.5)  # the engine_stats row of the last second
    assert paths["hot"].sql("SELECT max(max_batch_size) AS m FROM engine_stats") == [{"m": 4}]


def test_the_fleet_reads_as_one_in_the_archive(paths):
    for key in ("sk-hot-chat", "sk-cold-bulk"):
        assert _complete(paths["url"], key).status_code == 200
    for side in ("hot", "cold"):
        moved = httpx.post(paths[side].url + "/admin/archive", headers=ADMIN, timeout=60,
                           json={"older_than_s": 0}).json()
        assert moved["instance"] == side and moved["archived"]["requests"] >= 1
    out = subprocess.run(
        [sys.executable, "-m", "tailguard", "query", "--archive", str(paths["archive"]),
         "--format", "json",
         "SELECT instance, client, count(*) AS n FROM requests GROUP BY ALL ORDER BY ALL"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = {(r["instance"], r["client"]) for r in json.loads(out.stdout)}
    assert {("hot", "chat"), ("cold", "bulk")} <= seen
    assert not any(inst == "hot" and client == "bulk" for inst, client in seen)
