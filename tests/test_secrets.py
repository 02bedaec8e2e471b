"""Secrets on a real server: API keys and the admin token never reach the server log or
any trace-log table, also when they are sent where they do not belong; the generated
admin token file is private; the admin API refuses every other credential; the SQL
endpoint cannot write, touch files or the network, and bounds rows and time; a
priority header cannot raise a key's tier.

One server for the module, started without $TAILGUARD_ADMIN_TOKEN (so it generates
the token file) and with a keys file of random keys, so a hit cannot be a coincidence.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
import pytest

from observe.settings import TAILGUARD_ADMIN_TOKEN as ENV_ADMIN_TOKEN
from serving.admin.auth import default_token_file
from tests.conftest import Server, _wait_ready, free_port

MODEL = "tailguard-tiny-llama"


@dataclass
class Guarded:
    server: Server
    token: str
    token_file: Path
    keys: dict[str, str]  # name -> secret key

    def secrets(self) -> dict[str, str]:
        """Every secret and a prefix of each (a truncated key is a leak too)."""
        found = {f"key {name}": key for name, key in self.keys.items()}
        found["admin token"] = self.token
        for what, value in list(found.items()):
            found[f"{what} (prefix)"] = value[:14]
        return found


@pytest.fixture(scope="module")
def guarded(tmp_path_factory) -> Guarded:
    tmp = tmp_path_factory.mktemp("secrets")
    keys = {"vip-user": f"sk-tg-{secrets.token_hex(16)}",
            "plain-user": f"sk-tg-{secrets.token_hex(16)}",
            "bulk-user": f"sk-tg-{secrets.token_hex(16)}",
            "hashed-user": f"sk-tg-{secrets.token_hex(16)}"}
    keys_file = tmp / "keys.yaml"
    keys_file.write_text(
        "keys:\n"
        f"  - {{name: vip-user, key: {keys['vip-user']}, tier: realtime, vip: true}}\n"
        f"  - {{name: plain-user, key: {keys['plain-user']}}}\n"
        f"  - {{name: bulk-user, key: {keys['bulk-user']}, tier: batch}}\n"
        f"  - {{name: hashed-user, key_sha256: "
        f"{hashlib.sha256(keys['hashed-user'].encode()).hexdigest()}}}\n")
    db, log = tmp / "trace.duckdb", tmp / "server.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != ENV_ADMIN_TOKEN}
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db", str(db),
           "--flush-interval", "0.2", "--keys", str(keys_file),
           "--retrain-interval", "0", "--reselect-interval", "0"]
    # umask 0: the token file must be 0600 because the server says so, not by luck.
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                               start_new_session=True, umask=0)
    server = Server(f"http://127.0.0.1:{port}", db, process, log)
    try:
        _wait_ready(server)
        token_file = default_token_file(str(db))
        yield Guarded(server, token_file.read_text().strip(), token_file, keys)
    finally:
        _stop(server)


def _stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:  # the engine core and its workers, if the server left any
        os.killpg(server.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.process.wait(timeout=30)


def completion(srv: Server, headers: dict | None = None, **body) -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", headers=headers or {}, timeout=60,
                      json={"model": MODEL, "prompt": "word " * 6, "max_tokens": 2, **body})


def chat(srv: Server, headers: dict) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", headers=headers, timeout=60,
                      json={"model": MODEL, "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]})


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def admin_query(g: Guarded, sql: str, **extra) -> httpx.Response:
    return httpx.post(g.server.url + "/admin/query", headers=bearer(g.token), timeout=60,
                      json={"sql": sql, **extra})


def row(g: Guarded, resp: httpx.Response) -> dict:
    rid = resp.headers["x-request-id"]
    g.server.admin("/admin/flush", token=g.token)
    rows = admin_query(g, f"SELECT * FROM requests WHERE request_id = '{rid}'").json()
    assert len(rows["rows"]) == 1, rows
    return dict(zip(rows["columns"], rows["rows"][0]))


# --- the admin token -----------------------------------------------------------------

def test_the_generated_admin_token_file_is_private(guarded):
    assert guarded.token_file == Path(str(guarded.server.db) + ".admin-token")
    assert guarded.token_file.stat().st_mode & 0o777 == 0o600
    assert len(guarded.token) >= 32
    log = guarded.server.log.read_text()
    assert f"admin token in {guarded.token_file}" in log  # where, never what


ADMIN_ROUTES = [("POST", "/admin/query"), ("GET", "/admin/slo"), ("GET", "/admin/models"),
                ("POST", "/admin/models/latency/retrain"), ("POST", "/admin/archive"),
                ("POST", "/admin/flush"), ("GET", "/admin/policies"),
                ("PUT", "/admin/policies/vip_only"), ("GET", "/admin/audit"),
                ("GET", "/admin/faults"), ("PUT", "/admin/faults")]


def _wrong_credentials(g: Guarded) -> list[tuple[str, dict, dict]]:
    """(what, headers, query parameters): everything but 'Authorization: Bearer <token>'."""
    token = g.token
    basic = base64.b64encode(f"admin:{token}".encode()).decode()
    return [
        ("none", {}, {}),
        ("wrong token", bearer("not-the-token"), {}),
        ("token with a suffix", bearer(token + "x"), {}),
        ("token prefix", bearer(token[:-1]), {}),
        ("an API key", bearer(g.keys["vip-user"]), {}),
        ("no scheme", {"Authorization": token}, {}),
        ("basic auth", {"Authorization": f"Basic {basic}"}, {}),
        ("token scheme", {"Authorization": f"Token {token}"}, {}),
        ("other header", {"X-Admin-Token": token, "X-Api-Key": token}, {}),
        ("query string", {}, {"token": token, "access_token": token}),
        ("cookie", {"Cookie": f"token={token}"}, {}),
    ]


def test_every_admin_route_refuses_every_other_credential(guarded):
    with httpx.Client(base_url=guarded.server.url, timeout=30) as http:
        for method, path in ADMIN_ROUTES:
            for what, headers, params in _wrong_credentials(guarded):
                resp = http.request(method, path, headers=headers, params=params,
                                    json={"sql": "SELECT 1", "mode": "force_on",
                                          "reason": "x"})
                assert resp.status_code == 401, (method, path, what, resp.text)
                assert resp.json()["error"]["code"] == "unauthorized"
        # ... and nothing they asked for happened.
        policies = http.get("/admin/policies", headers=bearer(guarded.token)).json()
        vip = next(p for p in policies["policies"] if p["policy"] == "vip_only")
        assert vip["effective"] == "inactive", vip
        assert http.get("/admin/flush", headers=bearer(guarded.token)).status_code == 405
        resp = http.post("/admin/query", headers=bearer(guarded.token),
                         json={"sql": "SELECT 42 AS answer"})
        assert resp.status_code == 200 and resp.json()["rows"] == [[42]]


# --- the SQL endpoint ----------------------------------------------------------------

WRITES = [
    "INSERT INTO requests (request_id) VALUES ('x')",
    "DELETE FROM requests",
    "UPDATE requests SET status = 'ok'",
    "DROP TABLE spans",
    "CREATE TABLE t AS SELECT 1",
    "ALTER TABLE requests ADD COLUMN pwned INTEGER",
    "TRUNCATE requests",
    "CHECKPOINT",
    "WITH gone AS (DELETE FROM requests RETURNING *) SELECT count(*) FROM gone",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "SELECT 1; DELETE FROM requests",
]
FILES = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/passwd', header = false)",
    "SELECT content FROM read_text('/etc/passwd')",
    "SELECT content FROM read_blob('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM read_json('/etc/os-release')",
    "SELECT * FROM read_parquet('/tmp/*.parquet')",
    "SELECT * FROM 'http://127.0.0.1:9/x.csv'",
    "COPY requests TO '/tmp/tailguard-leak.csv'",
    "COPY (SELECT 1) TO '/tmp/tailguard-leak.csv'",
    "EXPORT DATABASE '/tmp/tailguard-leak'",
    "ATTACH '/tmp/tailguard-leak.duckdb' AS leak",
    "ATTACH ':memory:' AS scratch",
    "DETACH trace",
    "INSTALL httpfs",
    "LOAD httpfs",
    "FORCE INSTALL httpfs FROM 'http://127.0.0.1:9'",
    "CALL load_extension('httpfs')",
    "PRAGMA database_list",
]


def test_the_sql_endpoint_refuses_writes_files_and_the_network(guarded):
    g = guarded
    completion(g.server, bearer(g.keys["plain-user"]))  # at least one row to protect
    g.server.admin("/admin/flush", token=g.token)
    count_sql = ("SELECT (SELECT count(*) FROM requests) AS requests, "
                 "(SELECT count(*) FROM duckdb_tables()) AS tables, "
                 "(SELECT count(*) FROM duckdb_columns() WHERE table_name = 'requests') AS cols")
    before = admin_query(g, count_sql).json()["rows"]
    assert before[0][0] >= 1
    for sql in WRITES + FILES:
        resp = admin_query(g, sql)
        assert resp.status_code == 400, (sql, resp.status_code, resp.text)
        error = resp.json()["error"]
        assert error["code"] == "invalid_query", (sql, error)
        assert "root:" not in resp.text and "PRETTY_NAME" not in resp.text, sql
    assert admin_query(g, count_sql).json()["rows"] == before
    leaked = [p for p in ("/tmp/tailguard-leak.csv", "/tmp/tailguard-leak",
                          "/tmp/tailguard-leak.duckdb") if Path(p).exists()]
    assert not leaked
    # The switches that keep it so cannot be turned back from a SELECT.
    settings = admin_query(g, "SELECT current_setting('enable_external_access'), "
                              "current_setting('lock_configuration')")
    assert settings.json()["rows"] == [[False, True]]


def test_the_sql_endpoint_truncates_at_its_row_limit(guarded):
    resp = admin_query(guarded, "SELECT * FROM range(25000)")
    assert resp.status_code == 200
    assert len(resp.json()["rows"]) == 10_000 and resp.json()["truncated"] is True
    resp = admin_query(guarded, "SELECT * FROM range(25000)", max_rows=7)
    assert len(resp.json()["rows"]) == 7 and resp.json()["truncated"] is True
    resp = admin_query(guarded, "SELECT * FROM range(7)", max_rows=7)
    assert len(resp.json()["rows"]) == 7 and resp.json()["truncated"] is False


@pytest.mark.parametrize("max_rows", [-5, None, [1], 10**30])
def test_a_bad_max_rows_is_a_400(guarded, max_rows):
    resp = admin_query(guarded, "SELECT 1", max_rows=max_rows)
    assert resp.status_code == 400, (resp.status_code, resp.text)


def test_a_runaway_query_is_cut_by_the_timeout_while_serving_goes_on(guarded):
    g = guarded
    sql = ("SELECT count(*) FROM range(1000000000) a, range(1000000000) b "
           "WHERE a.range + b.range = -1")
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        slow = pool.submit(admin_query, g, sql)
        time.sleep(1.0)
        assert not slow.done()
        # The query runs off the event loop: requests are served meanwhile.
        resp = completion(g.server, bearer(g.keys["plain-user"]))
        assert resp.status_code == 200, resp.text
        assert httpx.get(g.server.url + "/healthz", timeout=5).status_code == 200
        resp = slow.result(timeout=60)
        took = time.monotonic() - started
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_query"
    assert resp.json()["error"]["message"] == "query timed out after 10s"
    assert 9 < took < 30
    assert admin_query(g, "SELECT 1 AS ok").json()["rows"] == [[1]]  # the reader still works


# --- priority ------------------------------------------------------------------------

@pytest.mark.parametrize("key,header,tier,vip", [
    ("bulk-user", "REALTIME", "batch", False),
    ("bulk-user", "realtime, realtime", "batch", False),
    ("bulk-user", "vip", "batch", False),
    ("bulk-user", "critical", "batch", False),
    ("plain-user", "vip", "realtime", False),  # no header makes a VIP
    ("plain-user", "Batch", "batch", False),
    ("vip-user", "batch", "batch", False),  # lowering also drops VIP
    ("vip-user", "realtime", "realtime", True),
])
def test_a_priority_header_only_ever_lowers(guarded, key, header, tier, vip):
    resp = completion(guarded.server, {**bearer(guarded.keys[key]),
                                       "X-Tailguard-Priority": header})
    assert resp.status_code == 200, resp.text
    got = row(guarded, resp)
    assert (got["priority"], got["vip"]) == (tier, vip)


def test_a_repeated_priority_header_cannot_raise_a_batch_key(guarded):
    headers = [("Authorization", f"Bearer {guarded.keys['bulk-user']}"),
               ("X-Tailguard-Priority", "realtime"), ("X-Tailguard-Priority", "realtime")]
    resp = httpx.post(guarded.server.url + "/v1/completions", headers=headers, timeout=60,
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert resp.status_code == 200, resp.text
    got = row(guarded, resp)
    assert (got["priority"], got["vip"]) == ("batch", False)


# --- no secret anywhere (last: it stops the server) ----------------------------------

def _traffic(g: Guarded, canary: str) -> dict[str, int]:
    """Real requests with every key, and every way of sending a key or the token where
    it does not belong; returns the count of each status. `canary` goes in as a request
    id: the scan below must find it, or it could not find a secret either."""
    srv, keys, statuses = g.server, g.keys, {}
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def note(resp: httpx.Response, expected: int) -> None:
        assert resp.status_code == expected, (resp.status_code, resp.text)
        statuses[expected] = statuses.get(expected, 0) + 1

    for name, key in keys.items():
        note(completion(srv, bearer(key)), 200)
        note(chat(srv, bearer(key)), 200)
        note(completion(srv, bearer(key), stream=True), 200)
        # The key as a W3C trace state (kept in the span context, never in a row).
        note(completion(srv, {**bearer(key), "traceparent": traceparent,
                              "tracestate": f"tg={key[-20:]}"}), 200)
    plain = keys["plain-user"]
    basic = base64.b64encode(f"user:{plain}".encode()).decode()
    for headers, params in [
        (bearer(plain[:-1] + ("0" if plain[-1] != "0" else "1")), {}),  # one char off
        (bearer(plain + "x"), {}),
        (bearer(g.token), {}),  # the admin token is no API key
        ({"Authorization": plain}, {}),
        ({"Authorization": f"Basic {basic}"}, {}),
        ({"Authorization": f"Token {plain}"}, {}),
        ({"X-Api-Key": plain, "Api-Key": plain}, {}),
        ({"OpenAI-Organization": plain, "Cookie": f"api_key={plain}"}, {}),
        ({}, {"api_key": plain, "key": plain}),
        ({"traceparent": f"00-{plain}-01"}, {}),
    ]:
        resp = httpx.post(srv.url + "/v1/completions", headers=headers, params=params,
                          timeout=30, json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        note(resp, 401)
        assert resp.json()["error"]["code"] == "invalid_api_key"
    # A key in the body is the caller's text; it must still not be echoed into a row.
    note(completion(srv, bearer(plain), user=plain), 200)
    note(completion(srv, {**bearer(plain), "X-Request-Id": canary}), 200)
    for _, headers, params in _wrong_credentials(g):
        note(httpx.post(srv.url + "/admin/query", headers=headers, params=params,
                        json={"sql": "SELECT 1"}, timeout=30), 401)
    note(httpx.post(srv.url + "/admin/query", headers=bearer(g.token),
                    json={"sql": "SELECT count(*) FROM requests"}, timeout=30), 200)
    note(httpx.put(srv.url + "/admin/policies/vip_only", headers=bearer(g.token),
                   json={"mode": "auto", "reason": "secrets test"}, timeout=30), 200)
    return statuses


def _hits(text: str, secrets_: dict[str, str]) -> list[str]:
    return [what for what, value in secrets_.items() if value in text]


def test_no_secret_reaches_the_log_or_the_trace_log(guarded):
    g = guarded
    canary = f"canary-{secrets.token_hex(8)}"
    statuses = _traffic(g, canary)
    assert statuses[200] >= 17 and statuses[401] >= 20
    g.server.admin("/admin/flush", token=g.token)
    rejected = admin_query(g, "SELECT count(*) FROM requests WHERE http_status = 401")
    assert rejected.json()["rows"][0][0] >= 10  # the refusals have rows too
    _stop(g.server)  # a clean stop: every row written, the WAL checkpointed
    all_secrets = g.secrets()
    log = g.server.log.read_text(errors="replace")
    assert "tailguard ready" in log
    assert _hits(log, all_secrets) == []
    leaks, cells, found = [], 0, set()
    with duckdb.connect(str(g.server.db), read_only=True) as conn:
        tables = [t for (t,) in conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
        assert {"requests", "spans", "policy_events", "overrides"} <= set(tables)
        for table in tables:
            columns = [c for (c,) in conn.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND "
                "(data_type LIKE 'VARCHAR%' OR data_type = 'JSON')", [table]).fetchall()]
            for column in columns:
                for (value,) in conn.execute(f"SELECT {column}::VARCHAR FROM {table} "
                                             f"WHERE {column} IS NOT NULL").fetchall():
                    cells += 1
                    if canary in value:
                        found.add(f"{table}.{column}")
                    leaks += [f"{table}.{column}: {what}" for what in _hits(value, all_secrets)]
    assert cells > 100
    assert leaks == []
    assert {"requests.request_id", "spans.request_id"} <= found  # the scan can see
    # The bytes on disk as well (strings may be compressed there; this is the extra mile).
    for path in g.server.db.parent.iterdir():
        if path.name.startswith("trace.duckdb") and path.is_file() and path != g.token_file:
            assert _hits(path.read_bytes().decode("latin-1"), all_secrets) == [], path


def test_a_token_file_others_can_read_is_used_with_a_warning(tmp_path, monkeypatch, caplog):
    from serving.admin.auth import resolve_admin_token

    monkeypatch.delenv("TAILGUARD_ADMIN_TOKEN", raising=False)
    path = tmp_path / "token"
    path.write_text("s3cret-token-value\n")
    for mode, warned in ((0o600, False), (0o640, True), (0o644, True), (0o400, False)):
        path.chmod(mode)
        caplog.clear()
        with caplog.at_level("WARNING", logger="tailguard"):
            assert resolve_admin_token(str(tmp_path / "t.duckdb"), str(path)) == (
                "s3cret-token-value", str(path))
        messages = [r.getMessage() for r in caplog.records]
        assert bool(messages) is warned, (oct(mode), messages)
        if warned:
            assert f"mode {mode:04o}" in messages[0] and "s3cret" not in messages[0]
