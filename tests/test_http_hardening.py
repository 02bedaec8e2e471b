"""Hostile clients against a real server (loopback, raw sockets): idle, half-header and
half-body connections are closed on time, the connection cap holds, no redirect echoes
the Host header, X-Forwarded-For is not believed, the schema is not public and every
`/admin` route refuses a missing, wrong or empty token."""

from __future__ import annotations

import json
import re
import select
import selectors
import socket
import time
import urllib.error
import urllib.request
from unittest import mock

import pytest

from tests.conftest import ADMIN_TOKEN, start_server, stop_server

HEADER_S, BODY_S, KEEP_ALIVE_S, MAX_CONNECTIONS = 2.0, 2.0, 1.0, 120
SLACK_S = 3.0
PARTIAL_HEADERS = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
PARTIAL_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")


@pytest.fixture(scope="module")
def hard_server(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TAILGUARD_HTTP_HEADER_TIMEOUT_S", str(HEADER_S))
        env.setenv("TAILGUARD_HTTP_BODY_TIMEOUT_S", str(BODY_S))
        env.setenv("TAILGUARD_HTTP_KEEP_ALIVE_S", str(KEEP_ALIVE_S))
        env.setenv("TAILGUARD_HTTP_MAX_CONNECTIONS", str(MAX_CONNECTIONS))
        srv = start_server(tmp_path_factory.mktemp("hard"), "--retrain-interval", "0",
                           "--reselect-interval", "0", "--enable-fault-injection")
    yield srv
    stop_server(srv)


def _open(server, payload: bytes = b"", count: int = 1) -> list[socket.socket]:
    host, port = server.url.removeprefix("http://").split(":")
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        if payload:
            sock.sendall(payload)
        socks.append(sock)
    return socks


def _wait_closed(socks, limit_s: float) -> dict[socket.socket, tuple[float, bytes]]:
    """Each socket the server closed within `limit_s`: (seconds until EOF, bytes read)."""
    start, got, closed = time.monotonic(), {s: b"" for s in socks}, {}
    sel = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    while len(closed) < len(socks) and time.monotonic() - start < limit_s:
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(65536)
            except (ConnectionResetError, BlockingIOError):
                data = b""
            got[key.fileobj] += data
            if not data:
                closed[key.fileobj] = (time.monotonic() - start, got[key.fileobj])
                sel.unregister(key.fileobj)
    sel.close()
    for sock in socks:
        sock.close()
    return closed


def _get(server, path: str, headers: dict | None = None, method: str = "GET",
         body: bytes | None = None):
    """(status, headers, parsed JSON or None), without following redirects."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(server.url + path, data=body, method=method,
                                 headers=headers or {})
    try:
        with opener.open(req, timeout=30) as resp:
            status, head, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        status, head, raw = exc.code, exc.headers, exc.read()
    try:
        return status, head, json.loads(raw)
    except ValueError:
        return status, head, None


def test_idle_and_half_header_connections_are_closed_after_the_header_timeout(hard_server):
    idle = _open(hard_server, count=25)
    partial = _open(hard_server, PARTIAL_HEADERS, count=25)
    assert _get(hard_server, "/healthz")[0] == 200  # the server still answers meanwhile
    closed = _wait_closed(idle + partial, HEADER_S + SLACK_S)
    assert len(closed) == 50
    assert max(seconds for seconds, _ in closed.values()) < HEADER_S + SLACK_S
    assert all(data == b"" for sock, (_, data) in closed.items() if sock in idle)
    assert all(data.startswith(b"HTTP/1.1 408 ") for sock, (_, data) in closed.items()
               if sock in partial)


def test_a_trickled_header_is_cut_at_the_header_timeout(hard_server):
    """One byte every 50 ms is progress, but the headers never end: the deadline holds."""
    sock = _open(hard_server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ")[0]
    start, answer = time.monotonic(), b""
    while time.monotonic() - start < HEADER_S + SLACK_S:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            answer = sock.recv(65536)
            break
        sock.sendall(b"a")
    seconds = time.monotonic() - start
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 ") and seconds < HEADER_S + SLACK_S


def test_half_body_connections_end_with_408_and_are_closed(hard_server):
    socks = _open(hard_server, PARTIAL_BODY, count=50)
    assert _get(hard_server, "/healthz")[0] == 200
    closed = _wait_closed(socks, BODY_S + SLACK_S)
    assert len(closed) == 50
    for _, data in closed.values():
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
        assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_stalled_upload_is_logged_as_the_408_its_client_got(hard_server):
    rid = "stalled-upload-1"
    payload = PARTIAL_BODY.replace(b"\r\n\r\n", f"\r\nX-Request-Id: {rid}\r\n\r\n".encode())
    closed = _wait_closed(_open(hard_server, payload), BODY_S + SLACK_S)
    assert len(closed) == 1 and next(iter(closed.values()))[1].startswith(b"HTTP/1.1 408 ")
    deadline = time.monotonic() + 30
    while not (rows := hard_server.sql(
            f"SELECT status, http_status, error_type FROM requests WHERE request_id = '{rid}'")):
        assert time.monotonic() < deadline, "no row for the stalled upload"
        time.sleep(0.5)
    assert rows == [{"status": "rejected", "http_status": 408, "error_type": "request_timeout"}]


@pytest.mark.parametrize("headers", [
    [(f"x-many-{i}", "v") for i in range(200)],  # 20,000 of these were served before
    [("x-big", "a" * 100_000)],  # so was a 1 MB header
], ids=["200 header lines", "100 kB of header"])
def test_oversized_headers_get_431_and_the_connection_is_closed(hard_server, headers):
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    payload = f"GET /healthz HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode()
    closed = _wait_closed(_open(hard_server, payload), SLACK_S)
    assert len(closed) == 1
    answer = next(iter(closed.values()))[1]
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1  # uvicorn's own 400 is not sent after it
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == \
        "headers_too_large"
    fine = [(f"x-some-{i}", "v" * 100) for i in range(100)]  # within both bounds
    assert _get(hard_server, "/healthz", dict(fine))[0] == 200


def test_an_idle_keep_alive_connection_is_closed(hard_server):
    sock = _open(hard_server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")[0]
    closed = _wait_closed([sock], KEEP_ALIVE_S + SLACK_S)
    seconds, data = closed[sock]
    assert data.startswith(b"HTTP/1.1 200 ") and seconds < KEEP_ALIVE_S + SLACK_S


def test_connections_over_the_cap_are_refused_until_idle_ones_time_out(hard_server):
    socks = _open(hard_server, count=MAX_CONNECTIONS + 10)
    closed = _wait_closed(socks, 1.0)  # the last ten are closed at once, with a 503
    assert len(closed) >= 10
    assert all(data.startswith(b"HTTP/1.1 503 ") for _, data in closed.values())
    time.sleep(HEADER_S + 1)  # the cap frees as the idle ones are timed out
    assert _get(hard_server, "/healthz")[0] == 200


def test_no_trailing_slash_redirect_echoes_the_host_header(hard_server):
    for path in ("/v1/models/", "/admin/policies/"):
        status, headers, body = _get(hard_server, path, {"Host": "evil.example"})
        assert status == 404 and "location" not in {k.lower() for k in headers}
        assert body["error"]["code"] == "not_found"


def test_the_audit_actor_is_the_peer_not_x_forwarded_for(hard_server):
    status, _, listing = _get(hard_server, "/admin/policies",
                              {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    name = listing["policies"][0]["policy"]
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Forwarded-For": "6.6.6.6",
               "Content-Type": "application/json"}
    for body, actor in (({}, "127.0.0.1"), ({"actor": "alice"}, "alice via 127.0.0.1")):
        payload = json.dumps({"mode": "auto", "reason": "hardening test", **body}).encode()
        status, _, answer = _get(hard_server, f"/admin/policies/{name}", headers, "PUT",
                                 payload)
        assert status == 200 and answer["actor"] == actor
    _, _, audit = _get(hard_server, "/admin/audit", headers)
    assert [row["actor"] for row in audit["overrides"][:2]] == ["alice via 127.0.0.1",
                                                                "127.0.0.1"]


def test_docs_and_schema_are_not_public(hard_server):
    for path in ("/docs", "/redoc", "/openapi.json", "/admin/openapi.json"):
        assert _get(hard_server, path)[0] in (401, 404), path
    status, _, schema = _get(hard_server, "/admin/openapi.json",
                             {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200 and "/v1/completions" in schema["paths"]


def _admin_routes() -> list[tuple[str, str]]:
    """Every (method, path) under /admin of the app as built, hidden routes too."""
    from serving.app import create_app

    app = create_app(mock.MagicMock())
    routes = [(method, route.path) for route in app.routes
              for method in sorted(getattr(route, "methods", None) or ())
              if route.path.startswith("/admin")]
    assert ("GET", "/admin/tracelog") in routes and ("GET", "/admin/openapi.json") in routes
    return routes


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789", "Bearer ",
                                           "Bearer", f"Basic {ADMIN_TOKEN}", ADMIN_TOKEN])
def test_every_admin_route_refuses_without_the_token(hard_server, authorization):
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    for method, path in _admin_routes():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        status, _, body = _get(hard_server, concrete, headers, method,
                               b"{}" if method in ("POST", "PUT") else None)
        assert status == 401, (method, path, status)
        if method != "HEAD":
            assert body["error"]["code"] == "unauthorized"


def _read_response(sock) -> tuple[bytes, bytes]:
    """(status line, body) of one Content-Length answer on a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"closed mid-answer: {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail("closed mid-body")
    return head.split(b"\r\n")[0], body


def test_a_slow_upload_and_a_slow_answer_inside_the_deadlines_are_served(hard_server):
    """The deadlines cut stalled clients only: a body sent in two parts with a pause
    under the body timeout, answered after longer than every timeout, then a second
    request on the same connection inside the keep-alive timeout, all succeed."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
    slow = json.dumps({"mode": "slow", "delay_s": HEADER_S + BODY_S + 1}).encode()
    assert _get(hard_server, "/admin/faults", admin, "PUT", slow)[0] == 200
    body = json.dumps({"prompt": "hello", "max_tokens": 2}).encode()
    sock = _open(hard_server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])[0]
    try:
        sock.settimeout(60)
        time.sleep(BODY_S / 2)
        sock.sendall(body[5:])
        status, answer = _read_response(sock)
        assert status == b"HTTP/1.1 200 OK", answer
        time.sleep(KEEP_ALIVE_S / 2)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock)[0] == b"HTTP/1.1 200 OK"
    finally:
        sock.close()
        _get(hard_server, "/admin/faults", admin, "PUT", b'{"mode": "none"}')


@pytest.mark.parametrize("allowed,client", [(None, "127.0.0.1"), ("127.0.0.1", "6.6.6.6")])
def test_x_forwarded_for_counts_only_from_the_allowed_proxies(allowed, client):
    """serve's uvicorn settings, on a one-route app: the opt-in is what turns it on."""
    import threading
    from types import SimpleNamespace

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from serving.http_limits import HttpLimits
    from serving.server import connection_settings
    from tests.conftest import free_port

    app = Starlette(routes=[Route("/", lambda r: PlainTextResponse(r.client.host))])
    config = SimpleNamespace(http_limits=HttpLimits(), forwarded_allow_ips=allowed)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning",
                                           **connection_settings(config)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/",
                                     headers={"X-Forwarded-For": "6.6.6.6"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.read().decode() == client
    finally:
        server.should_exit = True
        thread.join(timeout=10)
