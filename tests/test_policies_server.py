"""Degradation policies on a real engine: each trips on its condition (driven by
fault injection or real load) and recovers; overrides beat automatic decisions,
expire, and survive a restart; shed requests get 503 + Retry-After and a row, and
requests that cannot meet their deadline get 429 + Retry-After at once.

One server for the module, with short timings (tests/data/policies_fast.yaml) so a
trip-and-recover cycle takes seconds, a keys file with a VIP key, and a small KV cache
so memory pressure is reachable.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, start_server, stop_server

DATA = Path(__file__).parent / "data"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
VIP, PLAIN, BULK = "sk-test-vip", "sk-test-plain", "sk-test-bulk"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    srv = _start(tmp_path_factory.mktemp("guarded"))
    yield srv
    stop_server(srv)


def _start(tmp: Path):
    return start_server(tmp, "--keys", str(DATA / "keys.yaml"), "--policies",
                        str(DATA / "policies_fast.yaml"), "--enable-fault-injection",
                        "--retrain-interval", "0", "--reselect-interval", "0",
                        # float32 on every CPU: the KV cache holds the same tokens
                        # (about 4,000) wherever the suite runs
                        "--", "--dtype", "float32",
                        "--kv-cache-memory-bytes", str(32 * 1024 * 1024))


def complete(srv, key: str = PLAIN, words: int = 20, max_tokens: int = 4,
             timeout: float = 120, prefix: str = "") -> httpx.Response:
    return httpx.post(srv.url + "/v1/completions", timeout=timeout,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": "tailguard-tiny-llama",
                            "prompt": prefix + "word " * words,
                            "max_tokens": max_tokens, "ignore_eos": True})


def policies(srv) -> dict:
    resp = httpx.get(srv.url + "/admin/policies", headers=AUTH, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def state(srv, name: str) -> str:
    return next(p for p in policies(srv)["policies"] if p["policy"] == name)["effective"]


def _admitted(limiter: dict) -> int:
    """Requests past the deadline check: in the engine or waiting at its gate."""
    return limiter["in_flight"] + limiter["waiting"]


def wait_for(predicate, timeout: float = 60, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")


def settled(srv, timeout: float = 90) -> None:
    """Wait out what earlier tests tripped: the breaker and the load policies (on a
    slow CPU truncation was still on from the test before and cut a prompt in half)."""
    for name in ("breaker_l1", "vip_only", "token_cap", "truncation"):
        wait_for(lambda: state(srv, name) == "inactive", timeout=timeout)


def fault(srv, mode: str, **kw) -> None:
    resp = httpx.put(srv.url + "/admin/faults", headers=AUTH, timeout=10,
                     json={"mode": mode, **kw})
    assert resp.status_code == 200, resp.text


def override(srv, name: str, mode: str, reason: str = "test", **kw) -> httpx.Response:
    return httpx.put(srv.url + f"/admin/policies/{name}", headers=AUTH, timeout=10,
                     json={"mode": mode, "reason": reason, **kw})


def transitions(srv, policy: str) -> list[tuple[str, str]]:
    rows = srv.sql(f"SELECT from_state, to_state FROM policy_events WHERE policy = "
                   f"'{policy}' ORDER BY ts")
    return [(r["from_state"], r["to_state"]) for r in rows]


def request_row(srv, resp: httpx.Response) -> dict:
    rid = resp.headers.get("x-request-id")
    rows = srv.sql(f"SELECT * FROM requests WHERE request_id = '{rid}'")
    assert len(rows) == 1, (rid, rows)
    return rows[0]


def test_no_key_or_a_wrong_key_is_401_with_a_row(guarded):
    resp = complete(guarded, key="sk-nope")
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert request_row(guarded, resp)["status"] == "rejected"


def test_the_key_sets_the_priority_and_a_header_cannot_raise_it(guarded):
    bulk = httpx.post(guarded.url + "/v1/completions", timeout=60,
                      headers={"Authorization": f"Bearer {BULK}",
                               "X-Tailguard-Priority": "realtime"},
                      json={"model": "tailguard-tiny-llama", "prompt": "hi", "max_tokens": 2})
    assert bulk.status_code == 200
    assert request_row(guarded, bulk)["priority"] == "batch"
    assert request_row(guarded, complete(guarded, VIP))["priority"] == "realtime"


def test_token_cap_trips_on_queue_depth_and_recovers(guarded):
    fault(guarded, "stall", timeout_s=60)
    with ThreadPoolExecutor(12) as pool:
        # VIP: a deep queue of plain requests would be refused by the deadline check
        stalled = [pool.submit(complete, guarded, VIP, 20, 4) for _ in range(7)]
        wait_for(lambda: state(guarded, "token_cap") == "active")
        described = next(p for p in policies(guarded)["policies"] if p["policy"] == "token_cap")
        assert described["reason"].startswith("queue depth") and described["since"] > 0
        capped = pool.submit(complete, guarded, VIP, 20, 400)
        time.sleep(0.5)
        fault(guarded, "none")
        assert all(f.result().status_code == 200 for f in stalled)
        resp = capped.result()
    assert resp.status_code == 200
    row = request_row(guarded, resp)
    assert row["max_tokens"] == 256 and "cap_max_tokens:256" in row["policy_actions"]
    wait_for(lambda: state(guarded, "token_cap") == "inactive", timeout=30)
    assert transitions(guarded, "token_cap")[-3:] == [
        ("inactive", "active"), ("active", "recovering"), ("recovering", "inactive")]


def test_breaker_l1_trips_on_a_slow_engine_probes_one_at_a_time_and_recovers(guarded):
    """Requests far slower than the engine model says (an injected 0.8 s before the
    engine, against a ~30 ms estimate): sick. One request at a time gets through;
    the deadline check, its estimate scaled by the slowdown, refuses (429) what the
    sick engine cannot serve in time, VIP aside."""
    settled(guarded)
    fault(guarded, "slow", delay_s=0.8)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: complete(guarded), range(8)))
    wait_for(lambda: state(guarded, "breaker_l1") == "active", timeout=30)
    described = next(p for p in policies(guarded)["policies"] if p["policy"] == "breaker_l1")
    assert "slower than the engine model" in described["reason"]
    decisions = policies(guarded)["decisions"]
    assert decisions["probing"] and decisions["slowdown"] > 3
    assert policies(guarded)["limiter"]["limit"] == 1  # one probe at a time
    refused = complete(guarded, PLAIN)
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "deadline"
    row = request_row(guarded, refused)
    assert row["status"] == "rejected" and row["policy_actions"] == ["refuse:deadline"]
    assert complete(guarded, VIP).status_code == 200  # VIP still served
    fault(guarded, "none")
    wait_for(lambda: state(guarded, "breaker_l1") == "inactive", timeout=60)
    assert complete(guarded, PLAIN).status_code == 200


def test_breaker_l1_trips_on_a_stalled_engine(guarded):
    """No engine step for breaker_stall_s (2 s here) while requests wait: sick."""
    settled(guarded)
    fault(guarded, "stall", timeout_s=60)
    try:
        with ThreadPoolExecutor(2) as pool:
            stalled = [pool.submit(complete, guarded, VIP) for _ in range(2)]
            wait_for(lambda: state(guarded, "breaker_l1") == "active", timeout=30)
            described = next(p for p in policies(guarded)["policies"]
                             if p["policy"] == "breaker_l1")
            assert described["reason"].startswith("no engine step for")
            fault(guarded, "none")
            assert [f.result().status_code for f in stalled] == [200, 200]
    finally:
        fault(guarded, "none")
    wait_for(lambda: state(guarded, "breaker_l1") == "inactive", timeout=60)


FLOOD = 12  # long VIP prompts that make short realtime requests infeasible


def test_a_surge_is_refused_early_with_retry_after_and_never_trips_the_breaker(guarded):
    """Load alone: a queue of long prompts makes short realtime requests infeasible,
    so they are refused at once (429, the drain time as Retry-After, the estimate in
    the row) rather than served late; VIP is served; the breaker stays down."""
    settled(guarded)
    events_before = len(transitions(guarded, "breaker_l1"))
    with ThreadPoolExecutor(FLOOD + 2) as pool:
        # VIP: never refused for load, so the flood is admitted into the engine
        # each its own prompt: identical ones hit vLLM's prefix cache once the first is
        # prefilled, and leave no work ahead (a fast CPU got there before the check)
        flood = [pool.submit(complete, guarded, VIP, 1800, 8, prefix=f"flood {i} ")
                 for i in range(FLOOD)]
        # ten admitted (a prefill takes 0.6 s in float32 on a 2-core Xeon): more prompts
        # than a step's budget can advance beside a short one under the chunk cap, so the
        # short one is infeasible however fast the CPU (with six, on an AMD EPYC the
        # deadline check sometimes judged it feasible beside them, and it was served)
        wait_for(lambda: _admitted(policies(guarded)["limiter"]) >= FLOOD - 2, timeout=30,
                 every=0.02)
        # VIPs pass the prefill gate (one step's prefill: the token budget, 2048 here,
        # one of these prompts): all of them are in the engine, none waits in front
        snapshot = policies(guarded)
        gate, budget = snapshot["limiter"], snapshot["engine_model"]["token_budget"]
        assert gate["prefill_gate_tokens"] == budget and gate["waiting"] == 0, gate
        assert gate["engine_prefill_tokens"] > budget, gate
        assert gate["vip_kv_reserve_tokens"] is None and gate["kv_free_tokens"] > 0, gate
        # A streamed Responses call is refused the same way, by status code: vLLM's
        # handler has made its opening events, held until the engine would answer. Sent
        # beside the plain one, not after it, while the flood is surely still ahead.
        streaming = pool.submit(
            httpx.post, guarded.url + "/v1/responses", timeout=60,
            headers={"Authorization": f"Bearer {PLAIN}"},
            json={"model": "tailguard-tiny-llama", "stream": True, "input": "word " * 20,
                  "max_output_tokens": 4})
        began = time.monotonic()
        late = complete(guarded, PLAIN)
        assert time.monotonic() - began < 1.0  # refused at once, not after a wait
        streamed = streaming.result()
        vip = pool.submit(complete, guarded, VIP)
        assert late.status_code == 429, late.text
        assert 1 <= int(late.headers["retry-after"]) <= 120
        assert policies(guarded)["limiter"]["retry_bookings"] >= 1  # its time is kept
        row = request_row(guarded, late)
        assert row["policy_actions"] == ["refuse:deadline"] and row["status"] == "rejected"
        # infinite (the admin API's JSON says "Infinity") while the flood fills the KV
        # cache and no rate of its freeing is known yet
        assert float(row["estimated_ttft_s"]) > 0.8 * row["slo_ttft_target_s"]
        assert row["prompt_tokens"] == 21  # 20 words and the BOS token
        assert streamed.status_code == 429, streamed.text
        assert streamed.json()["error"]["code"] == "deadline"
        assert request_row(guarded, streamed)["endpoint"] == "responses"
        assert vip.result().status_code == 200
        assert [f.result().status_code for f in flood] == [200] * FLOOD
    assert state(guarded, "breaker_l1") == "inactive", guarded.sql(
        "SELECT * FROM policy_events WHERE policy = 'breaker_l1' ORDER BY ts DESC LIMIT 1")
    assert transitions(guarded, "breaker_l1")[events_before:] == []
    # drained: a feasible realtime request is admitted with its estimate on the row
    wait_for(lambda: policies(guarded)["limiter"]["in_flight"] == 0, timeout=60)
    settled(guarded)  # on a slow CPU the flood held the load up long enough for vip_only
    served = complete(guarded, PLAIN)
    assert served.status_code == 200
    row = request_row(guarded, served)
    assert row["policy_actions"] == [] and row["estimated_ttft_s"] > 0


def test_an_override_beats_the_automatic_state_and_expires(guarded):
    assert override(guarded, "vip_only", "force_on", "drill", ttl_s=3).status_code == 200
    assert state(guarded, "vip_only") == "active"
    assert complete(guarded, PLAIN).status_code == 503
    assert complete(guarded, VIP).status_code == 200
    wait_for(lambda: state(guarded, "vip_only") == "inactive", timeout=15)
    assert complete(guarded, PLAIN).status_code == 200
    audit = httpx.get(guarded.url + "/admin/audit", headers=AUTH, timeout=10).json()
    assert audit["overrides"][0]["policy"] == "vip_only"
    assert audit["overrides"][0]["reason"] == "drill"
    assert any(e["policy"] == "vip_only" and e["reason"] == "override expired"
               for e in audit["events"])


def client_counts(srv) -> dict[tuple[str, str], float]:
    """`tailguard_client_requests_total` on /metrics, per (client, outcome)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(srv.metrics()):
        for s in family.samples:
            if s.name == "tailguard_client_requests_total":
                key = (s.labels["client"], s.labels["outcome"])
                counts[key] = counts.get(key, 0.0) + s.value
    return counts


def test_each_key_is_a_tenant_in_its_rows_spans_metrics_and_the_console(guarded):
    from dashboards.console.client import AdminClient

    before = client_counts(guarded)
    assert override(guarded, "vip_only", "force_on", "tenants", ttl_s=30).status_code == 200
    try:
        vip, plain, stranger = (complete(guarded, key) for key in (VIP, PLAIN, "sk-nope"))
    finally:
        assert override(guarded, "vip_only", "auto").status_code == 200
    assert (vip.status_code, plain.status_code, stranger.status_code) == (200, 503, 401)
    rows = [request_row(guarded, r) for r in (vip, plain, stranger)]
    assert [r["client"] for r in rows] == ["vip-user", "plain-user", None]
    assert rows[1]["policy_actions"] == ["shed:vip_only"]
    (span,) = guarded.sql("SELECT attributes->>'$.\"enduser.id\"' AS client FROM spans "
                          f"WHERE request_id = '{rows[0]['request_id']}' "
                          "AND name = 'llm.request'")
    assert span["client"] == "vip-user"
    after = client_counts(guarded)
    served = "good" if rows[0]["slo_ok"] else "late"
    assert {k: v - before.get(k, 0.0) for k, v in after.items()
            if v != before.get(k, 0.0)} == {
        ("vip-user", served): 1.0, ("plain-user", "shed"): 1.0, ("unknown", "rejected"): 1.0}
    # The console's table (SQL through /admin/query) holds what the live counters count.
    tenants = AdminClient(guarded.url, ADMIN_TOKEN).tenants(24 * 60)
    assert {(t["client"], o): float(t[o]) for t in tenants
            for o in ("good", "late", "shed", "rejected", "error", "aborted") if t[o]} == after


def test_force_off_holds_a_policy_down_while_its_condition_holds(guarded):
    assert override(guarded, "token_cap", "force_off", "investigating").status_code == 200
    fault(guarded, "stall", timeout_s=60)
    try:
        with ThreadPoolExecutor(8) as pool:
            stalled = [pool.submit(complete, guarded, VIP) for _ in range(7)]
            wait_for(lambda: next(p for p in policies(guarded)["policies"]
                                  if p["policy"] == "token_cap")["state"] == "active")
            assert state(guarded, "token_cap") == "inactive"  # effective: forced off
            fault(guarded, "none")
            assert all(f.result().status_code == 200 for f in stalled)
    finally:
        fault(guarded, "none")
        override(guarded, "token_cap", "auto", "done")


@pytest.mark.parametrize("body,status,code", [
    ({"mode": "sideways", "reason": "x"}, 400, "invalid_mode"),
    ({"mode": "force_on"}, 400, "reason_required"),
    ({"mode": "force_on", "reason": "x", "ttl_s": "soon"}, 400, "invalid_ttl"),
])
def test_bad_overrides_are_400(guarded, body, status, code):
    resp = httpx.put(guarded.url + "/admin/policies/vip_only", headers=AUTH, json=body,
                     timeout=10)
    assert resp.status_code == status and resp.json()["error"]["code"] == code


def test_an_unknown_policy_is_404(guarded):
    assert override(guarded, "nope", "force_on").status_code == 404


@pytest.mark.parametrize("method,path", [("GET", "/admin/policies"),
                                         ("PUT", "/admin/policies/vip_only"),
                                         ("GET", "/admin/audit"), ("PUT", "/admin/faults")])
def test_the_policy_api_needs_the_token(guarded, method, path):
    assert httpx.request(method, guarded.url + path, timeout=10,
                         json={"mode": "force_on", "reason": "x"}).status_code == 401


def test_load_trips_vip_only_and_truncation_then_they_recover(guarded):
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            complete(guarded, VIP, words=1500, max_tokens=8)

    threads = [threading.Thread(target=hammer) for _ in range(6)]  # the load never dips
    for t in threads:
        t.start()
    try:
        wait_for(lambda: state(guarded, "truncation") == "active", timeout=90)
        long_doc = complete(guarded, VIP, words=3000, max_tokens=2)
        assert long_doc.status_code == 200
        assert long_doc.json()["usage"]["prompt_tokens"] == 2048
        assert any(a.startswith("truncate:") for a in request_row(guarded, long_doc)
                   ["policy_actions"])
        wait_for(lambda: state(guarded, "vip_only") == "active", timeout=60)
        assert complete(guarded, PLAIN).status_code == 503
    finally:
        stop.set()
        for t in threads:
            t.join()
    for name in ("vip_only", "truncation"):
        wait_for(lambda: state(guarded, name) == "inactive", timeout=60)


def test_memory_pressure_lowers_the_concurrency_limit(guarded):
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(complete, guarded, VIP, 1500, 200) for _ in range(6)]
        wait_for(lambda: state(guarded, "memory_pressure") == "active", timeout=60)
        # One snapshot: the controller's limit and the limiter's may both move between
        # calls (an earlier test can leave breaker L1 recovering, which lowers it more).
        snapshot = policies(guarded)
        controller = snapshot["policies"][-1]["limit"]
        assert snapshot["limiter"]["limit"] <= max(1, controller // 2)
        assert all(f.result().status_code == 200 for f in futures)
    wait_for(lambda: state(guarded, "memory_pressure") == "inactive", timeout=60)


def test_batch_control_cuts_the_limit_after_three_slow_windows(guarded):
    # Earlier tests' load may have cut the limit already, even to the floor: force_off
    # holds it at the cap, and handing control back starts it over at 16 (above the
    # floor of 8, so a cut is possible); count only new cuts.
    assert override(guarded, "batch_control", "force_off", "reset").status_code == 200
    wait_for(lambda: policies(guarded)["policies"][-1]["limit"] == 64, timeout=10)
    cuts = ("SELECT count(*) AS n FROM policy_events WHERE policy = 'batch_control' "
            "AND reason LIKE 'TTFT P99%' AND from_state <> to_state")
    cuts_before = guarded.sql(cuts)[0]["n"]
    assert override(guarded, "batch_control", "auto", "reset done").status_code == 200
    wait_for(lambda: policies(guarded)["policies"][-1]["limit"] == 16, timeout=10)
    fault(guarded, "slow", delay_s=0.4)
    try:
        stop = threading.Event()

        def trickle():
            while not stop.is_set():
                complete(guarded, VIP)

        threads = [threading.Thread(target=trickle) for _ in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: guarded.sql(cuts)[0]["n"] > cuts_before, timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join()
        fault(guarded, "none")
    assert policies(guarded)["policies"][-1]["limit"] < 16


def test_breaker_l2_restarts_the_engine_and_recovers(guarded):
    # The slow engine of the test before can leave breaker L1 probing, which turns this
    # VIP request away (a `rejected` row) before it reaches the failing engine.
    settled(guarded)
    fault(guarded, "error")
    failed = complete(guarded, VIP)
    assert failed.status_code >= 500
    row = request_row(guarded, failed)
    assert row["status"] == "error", row
    wait_for(lambda: state(guarded, "breaker_l2") == "active", timeout=20)
    during = complete(guarded, VIP, timeout=30)
    assert during.status_code == 503 and "retry-after" in during.headers
    wait_for(lambda: complete(guarded, VIP).status_code == 200, timeout=180, every=2)
    wait_for(lambda: state(guarded, "breaker_l2") == "inactive", timeout=60)
    events = guarded.sql("SELECT reason FROM policy_events WHERE policy = 'breaker_l2'")
    assert any(e["reason"] == "restarting the engine" for e in events)


def test_fault_injection_is_off_on_a_normal_server(server):
    resp = httpx.put(server.url + "/admin/faults", headers=AUTH, json={"mode": "error"},
                     timeout=10)
    assert resp.status_code == 403 and json.loads(resp.text)["error"]["code"] == \
        "fault_injection_off"


def loop_lag_over(srv, bound: str) -> tuple[float, float]:
    """(samples in all, samples above `bound` s) of the event-loop lag histogram."""
    from prometheus_client.parser import text_string_to_metric_families

    total = under = 0.0
    for family in text_string_to_metric_families(srv.metrics()):
        for s in family.samples:
            if s.name == "tailguard_event_loop_lag_seconds_count":
                total = s.value
            elif s.name == "tailguard_event_loop_lag_seconds_bucket" and s.labels["le"] == bound:
                under = s.value
    return total, total - under


def test_a_blocked_event_loop_shows_in_the_lag_histogram_and_the_admin_view(guarded):
    """The drill holds the server's loop for 0.6 s: the histogram gets a sample above
    0.5 s, `GET /admin/policies` reports it as the worst, and serving goes on."""
    total, slow = loop_lag_over(guarded, "0.5")
    assert total > 0  # sampled since start, ten times a second
    fault(guarded, "block_loop", delay_s=0.6)
    wait_for(lambda: loop_lag_over(guarded, "0.5")[1] > slow, timeout=10, every=0.1)
    lag = policies(guarded)["event_loop_lag"]
    assert lag["worst_s"] >= 0.5 and lag["max_s"] >= 0.5 and lag["interval_s"] == 0.1
    assert httpx.get(guarded.url + "/admin/faults", headers=AUTH).json()["mode"] == "none"
    assert complete(guarded, VIP).status_code == 200
    # the step probe lost nothing to its socket's queue of 10 over this module's surges:
    # the loop drains before each output batch, the ledger's thread every 15 ms
    probe = policies(guarded)["step_probe"]
    assert probe["steps_seen"] > 0 and probe["steps_lost"] == 0, probe


def test_the_engine_serves_a_short_vip_before_an_earlier_vip_document(guarded):
    """vLLM's priority scheduling (tailguard's default) with admission's priority (lane,
    then deadline): two VIP requests wait inside the engine for KV-cache room, a
    document (due about 0.5 s after it came) and, 50 ms later, a short prompt (due 0.2
    s after it came). In vLLM's first-come order the document would block the queue
    until it fits; by deadline the short prompt goes first, into the room there is."""
    settled(guarded)
    # the holders must hold what they ask: on a slow CPU their own load tripped the
    # load policies (truncation halved them, the token cap shortened their decodes)
    for name in ("truncation", "token_cap", "memory_pressure"):
        assert override(guarded, name, "force_off", ttl_s=120).status_code == 200
    capacity = policies(guarded)["engine_model"]["kv_capacity_tokens"]
    holder_prompt = (capacity - 700) // 2 - 160  # two holders leave ~700 tokens free
    with ThreadPoolExecutor(4) as pool:
        holders = [pool.submit(complete, guarded, VIP, holder_prompt, 150, 180,
                               f"holder {i} ") for i in range(2)]
        wait_for(lambda: policies(guarded)["limiter"]["in_flight"] >= 2, timeout=60,
                 every=0.05)
        # both prefilled: the cache holds them (a sleep was too short on an AVX2 CPU,
        # where the two prompts take seconds: the document then found room at once)
        wait_for(lambda: policies(guarded)["limiter"]["engine_prefill_tokens"] == 0,
                 timeout=60, every=0.05)
        document = pool.submit(complete, guarded, VIP, 1200, 2, 180, "document ")
        time.sleep(0.05)
        short = pool.submit(complete, guarded, VIP, 20, 2, 180, "short ")
        rows = {name: request_row(guarded, f.result()) for name, f in
                (("document", document), ("short", short), ("holder", holders[0]))}
    for name in ("truncation", "token_cap", "memory_pressure"):
        assert override(guarded, name, "auto").status_code == 200
    doc, chat = rows["document"], rows["short"]
    assert doc["status"] == chat["status"] == "ok", rows
    assert doc["queue_s"] > 0.3, f"the document never waited for room: {doc}"

    # In first-come order the short prompt could not be scheduled before the document
    # was (at best in the same step); by deadline its first token comes while the
    # document still waits.
    def at(row) -> float:
        return datetime.fromisoformat(row["arrival_ts"]).timestamp()

    assert at(chat) + chat["ttft_s"] < at(doc) + doc["queue_s"], (chat, doc)


def test_overrides_survive_a_restart(guarded):
    """Last in this module: it stops the module's server and starts another on the same
    trace log (a second server of its own would cost another engine start)."""
    assert override(guarded, "vip_only", "force_on", "maintenance", ttl_s=3600,
                    actor="alice").status_code == 200
    stop_server(guarded)
    again = _start(guarded.db.parent)
    try:
        vip_only = next(p for p in policies(again)["policies"] if p["policy"] == "vip_only")
        assert vip_only["effective"] == "active"
        assert vip_only["override"]["actor"] == "alice via 127.0.0.1"
        assert complete(again, PLAIN).status_code == 503
    finally:
        stop_server(again)
