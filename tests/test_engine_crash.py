"""Engine faults under load, on a real engine: the engine core process crashes
(SIGKILL) or hangs (SIGSTOP) while a streamed and a plain request are generating.

Each time: the stream ends with a clean error event and `[DONE]`, the plain request
gets an OpenAI-style 503, both rows say `error` with `engine_dead`/`engine_hung`,
breaker L2 restarts the engine, new requests are served again within a bound (every
one of them, refused or served, with its trace row), and the old engine processes are
gone. The hang has no exception: the watchdog (`TAILGUARD_ENGINE_HANG_S`, short here)
notices the missing progress.

The bounds are the ones docs/reliability.md ("Engine faults") states: clients in
flight are answered within ENDED_S of a crash (HANG_S + ENDED_S of a hang), and a new
request is served within RECOVER_S of the failure being noticed: a crash at once, a
hang when the watchdog fires and the clients are answered. SPEC §5's seeds ask for 90%
of throughput back within 30 s; measured 12.5-13.8 s after a crash on a 2-CPU box.

One server for the module (the crash first, then the hang on the restarted engine);
the watchdog's rules are also checked on a fake engine, in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import httpx
import psutil
import pytest

from observe.record import RequestRecord
from observe.settings import TAILGUARD_ENGINE_HANG_S
from observe.stats import WallClock
from serving.engine import failures as F
from serving.engine import observed as E
from serving.engine.step_receiver import NoStepLedger
from serving.errors import from_outcome
from tests.conftest import start_server, stop_server

HANG_S = 5  # the watchdog's timeout on this server
ENDED_S = 2.0  # failure noticed -> every client in flight answered
RECOVER_S = 15.0  # failure noticed -> a new request served (breaker L2's restart)
# The margin: most of a restart is vLLM building its engine (the `start` of the
# server's "engine up" line), mostly spawning its worker interpreter, ~10 s on a quiet
# 2-CPU box and up to minutes on one shared with other heavy jobs. Past QUIET_START_S
# the box is busy, and the test holds tailguard to its own share instead: detection,
# the old engine's shutdown and the breaker, under OWN_S. The warm-up is the engine's
# own compute, timed by the server's log line too: it scales with the CPU (about 2 s
# on an AVX-512 box, 9-17 s in bfloat16 on an AVX2-only one), so it counts as vLLM's.
QUIET_START_S = 10.0
OWN_S = 4.0
UP = re.compile(r"engine up in [\d.]+ s: start ([\d.]+) s, warm-up ([\d.]+) s")
FROZEN = re.compile(r"engine up in .*; (\d+) objects out of the garbage collector's scans")
MIN_FROZEN = 100_000  # vLLM, torch and the serving objects: about 800,000 here
POLL_S = 0.2  # between requests while waiting for the restarted engine
CLIENT_S = 60  # no client waits longer than this for anything
MAX_TOKENS = 3900  # ~15 s of decoding: still running when the fault hits
EXPECTED = {
    "engine_dead": "the engine failed while serving this request and is being restarted; "
                   "retry shortly",
    "engine_hung": f"the engine made no progress for {HANG_S} s and is being restarted; "
                   "retry shortly",
}


# --- the watchdog and the failure mapping, on a fake engine ------------------------


class FakeEngine:
    """The bits of `AsyncLLM` the wrapper uses; `generate` fails with `error`."""

    errored = False

    def __init__(self, error: Exception | None = None):
        self.unfinished, self.propagated, self.error = 0, [], error
        self.output_processor = self

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished

    def propagate_error(self, exc: Exception) -> None:
        self.propagated.append(exc)

    def shutdown(self) -> None:
        pass

    async def generate(self, *args, **kwargs):
        if self.error is not None:
            raise self.error
        yield None  # pragma: no cover


def test_watchdog_trips_only_when_the_engine_owes_output_and_makes_no_progress():
    from vllm.v1.engine.exceptions import EngineDeadError

    inner, ledger = FakeEngine(), NoStepLedger()
    eng = E.ObservedEngine(inner, ledger, WallClock(), hang_s=5)
    assert not eng.watchdog(100) and not eng.watchdog(200)  # idle: never hung
    eng.in_flight = 1  # a stream whose slow client still holds it; the engine is done
    assert not eng.watchdog(300)
    inner.unfinished = 2  # the engine owes output from now (t=300) on
    assert not eng.watchdog(304.9)
    ledger.steps_seen = 1  # a step: progress
    assert not eng.watchdog(305) and not eng.watchdog(309.9)
    assert not eng.errored and eng.fault is None and inner.propagated == []
    assert eng.watchdog(310)  # 5 s without a step
    assert eng.fault == F.ENGINE_HUNG and eng.errored
    assert len(inner.propagated) == 1 and isinstance(inner.propagated[0], EngineDeadError)
    assert eng.watchdog(400) and len(inner.propagated) == 1  # once

    off = E.ObservedEngine(FakeEngine(), NoStepLedger(), WallClock(), hang_s=0)
    off._engine.unfinished = 1
    assert not off.watchdog(100) and not off.watchdog(10_000)


def test_hang_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(TAILGUARD_ENGINE_HANG_S, raising=False)
    assert F.engine_hang_s() == F.DEFAULT_ENGINE_HANG_S
    for raw, want in (("7", 7.0), ("0.5", 0.5), ("0", 0.0), ("abc", F.DEFAULT_ENGINE_HANG_S),
                      ("-1", F.DEFAULT_ENGINE_HANG_S), ("nan", F.DEFAULT_ENGINE_HANG_S)):
        monkeypatch.setenv(TAILGUARD_ENGINE_HANG_S, raw)
        assert F.engine_hang_s() == want, raw


def _generate(eng: E.ObservedEngine) -> F.EngineFailure | None:
    """Serve one request that fails; what the engine says cut it short."""
    rec = RequestRecord(request_id="r1", arrival=time.monotonic(), endpoint="chat")

    async def run():
        E.current_request.set(rec)
        with pytest.raises(Exception):
            async for _ in eng.generate({"prompt_token_ids": [1, 2]}, None, "r1"):
                pass

    asyncio.run(run())
    assert eng.in_flight == 0
    return eng.outcome(rec.request_id)


def test_a_request_the_engine_fails_under_carries_the_failure():
    from vllm.v1.engine.exceptions import EngineDeadError

    dead = E.ObservedEngine(FakeEngine(EngineDeadError()), NoStepLedger(), WallClock())
    err = from_outcome(_generate(dead))
    assert (err.status, err.error_type, err.outcome) == (503, "engine_dead", "error")
    assert dead.fault == F.ENGINE_DEAD and err.headers["Retry-After"].isdigit()
    # any other failure of a healthy engine is not an engine failure
    healthy = E.ObservedEngine(FakeEngine(ValueError("bad")), NoStepLedger(), WallClock())
    assert _generate(healthy) is None and healthy.fault is None


# --- a real engine, crashed and hung ----------------------------------------------


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with mock.patch.dict(os.environ, {"TAILGUARD_ENGINE_HANG_S": str(HANG_S)}):
        server = start_server(tmp_path_factory.mktemp("engine_crash"))
    server.engine_processes = []  # every engine process it had, checked at the end
    server.model = model(server)
    try:
        yield server
    finally:
        stop_server(server)
        left = [p for p in server.engine_processes if _alive(p)]
        for proc in left:  # leave nothing behind, even when failing
            _kill(proc)
        assert not left, f"engine processes outlived the server: {left}"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill(proc: psutil.Process) -> None:
    try:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    except psutil.Error:
        pass


def engine_core(srv) -> psutil.Process:
    """The server's engine core process (vLLM names it `VLLM::EngineCore`)."""
    for proc in psutil.Process(srv.process.pid).children(recursive=True):
        try:
            if "EngineCore" in " ".join(proc.cmdline()) or "EngineCor" in proc.name():
                return proc
        except psutil.Error:
            continue
    raise AssertionError("no engine core process under the server")


def model(srv) -> str:
    resp = httpx.get(srv.url + "/v1/models", timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()["data"][0]["id"]


def stream_chat(srv, name: str, started: threading.Event) -> dict:
    """A long streamed chat; `started` is set once tokens flow."""
    lines, began = [], time.monotonic()
    body = {"model": name, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    timeout = httpx.Timeout(10, read=CLIENT_S)
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body,
                      timeout=timeout) as resp:
        for line in resp.iter_lines():
            if line:
                lines.append(line)
            if len(lines) >= 10:
                started.set()
        return {"status": resp.status_code, "id": resp.headers.get("x-request-id"),
                "lines": lines, "raw": "\n".join(lines), "s": time.monotonic() - began}


def complete(srv, name: str, max_tokens: int = MAX_TOKENS, timeout: float = CLIENT_S):
    return httpx.post(srv.url + "/v1/completions", timeout=timeout,
                      json={"model": name, "prompt": "word " * 10, "max_tokens": max_tokens,
                            "ignore_eos": True})


def restarts(srv) -> int:
    return len(srv.sql("SELECT 1 FROM policy_events WHERE policy = 'breaker_l2' "
                       "AND reason = 'restarting the engine'"))


def fault_mid_stream(srv, sig: int) -> tuple[dict, httpx.Response, float, float, list]:
    """Start a plain and a streamed request, send `sig` to the engine core once
    tokens flow; both clients' outcomes, when the fault hit, how long after it the
    clients were answered, and the engine processes of the time."""
    core = engine_core(srv)
    old = [core, *core.children(recursive=True)]
    srv.engine_processes.extend(old)
    name, started = srv.model, threading.Event()
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(complete, srv, name)
        time.sleep(0.5)  # the plain request reaches the engine first
        streamed = pool.submit(stream_chat, srv, name, started)
        assert started.wait(30), "the stream never started"
        assert not plain.done(), "the plain request finished before the fault"
        os.kill(core.pid, sig)
        faulted = time.monotonic()
        try:
            stream, resp = streamed.result(CLIENT_S + 5), plain.result(CLIENT_S + 5)
        finally:
            if sig == signal.SIGSTOP and _alive(core):  # never leave it stopped
                core.send_signal(signal.SIGCONT)
        return stream, resp, faulted, time.monotonic() - faulted, old


def check_failed_cleanly(srv, stream: dict, resp: httpx.Response, error_type: str) -> None:
    message = EXPECTED[error_type]
    # the stream: tokens, then one clean error event (no traceback), then [DONE]
    assert stream["status"] == 200
    assert stream["lines"][-1] == "data: [DONE]", stream["lines"][-3:]
    assert stream["lines"][-2].startswith('data: {"error"'), stream["lines"][-3:]
    assert json.loads(stream["lines"][-2][len("data: "):]) == {"error": {
        "message": message, "type": "service_unavailable", "param": None, "code": 503}}
    assert sum(line.startswith('data: {"error"') for line in stream["lines"]) == 1
    assert '"delta"' in stream["raw"] and "Traceback" not in stream["raw"]
    # the plain request: an OpenAI-style 503 that says to come back
    assert resp.status_code == 503, resp.text
    assert resp.json() == {"error": {"message": message, "type": "service_unavailable",
                                     "param": None, "code": error_type}}
    assert resp.headers["retry-after"].isdigit()
    # both rows: failed, with the reason
    ids = (stream["id"], resp.headers["x-request-id"])
    rows = srv.sql("SELECT request_id, endpoint, stream, status, http_status, error_type, "
                   f"error_message FROM requests WHERE request_id IN {ids} "
                   "ORDER BY endpoint")
    assert rows == [
        {"request_id": stream["id"], "endpoint": "chat", "stream": True, "status": "error",
         "http_status": 503, "error_type": error_type, "error_message": message},
        {"request_id": ids[1], "endpoint": "text_completion", "stream": False,
         "status": "error", "http_status": 503, "error_type": error_type,
         "error_message": message}]


def check_recovered(srv, noticed_at: float, old: list, restarts_before: int) -> float:
    """A new request is served within RECOVER_S of the failure being noticed, by a new
    engine core; every request sent meanwhile (503s included) has its trace row; the
    old engine processes are gone; breaker L2 restarted the engine once. Returns the
    seconds from `noticed_at` to the first request served."""
    sent = []  # (request id, HTTP status) of every request answered
    while True:
        try:
            resp = complete(srv, srv.model, max_tokens=4, timeout=30)
            sent.append((resp.headers.get("x-request-id"), resp.status_code))
            if resp.status_code == 200:
                back_s = time.monotonic() - noticed_at
                break
            assert resp.status_code == 503, resp.text
        except httpx.HTTPError:
            pass
        assert time.monotonic() - noticed_at < CLIENT_S, "the engine did not come back"
        time.sleep(POLL_S)
    start_s, warmup_s = map(float, UP.findall(srv.log.read_text())[-1])  # the engine's part
    own_s = back_s - start_s - warmup_s
    assert own_s < OWN_S, f"{own_s:.1f} s of {back_s:.1f} s outside vLLM's engine start " \
                          f"and warm-up"
    if start_s <= QUIET_START_S:
        assert back_s - warmup_s < RECOVER_S, f"served again {back_s:.1f} s after the failure"
    assert not [p for p in old if _alive(p)], "an old engine process survived the restart"
    new = engine_core(srv)
    assert new.pid not in {p.pid for p in old}
    srv.engine_processes.extend([new, *new.children(recursive=True)])
    assert restarts(srv) == restarts_before + 1
    frozen = [int(n) for n in FROZEN.findall(srv.log.read_text())]
    assert len(frozen) >= 2 and min(frozen) > MIN_FROZEN, frozen  # frozen again after it
    check_rows(srv, sent)
    return back_s


def check_rows(srv, sent: list) -> None:
    """Every request answered has exactly one trace row with the status it got."""
    assert all(rid for rid, _ in sent), sent
    ids = ", ".join(f"'{rid}'" for rid, _ in sent)
    rows = srv.sql(f"SELECT request_id, http_status, status FROM requests "
                   f"WHERE request_id IN ({ids})")
    assert sorted((r["request_id"], r["http_status"]) for r in rows) == sorted(sent)
    for row in rows:  # refused while the engine restarted: not ready, or breaker L2
        assert row["status"] in (("ok",) if row["http_status"] == 200
                                 else ("error", "rejected")), row


def test_engine_crash_mid_stream_fails_cleanly_and_restarts(srv):
    before = restarts(srv)
    stream, resp, faulted, ended_s, old = fault_mid_stream(srv, signal.SIGKILL)
    assert ended_s < ENDED_S, f"clients waited {ended_s:.1f} s after the crash"
    check_failed_cleanly(srv, stream, resp, "engine_dead")
    back_s = check_recovered(srv, faulted, old, before)  # a crash is noticed at once
    print(f"crash: clients answered in {ended_s:.2f} s, served again in {back_s:.1f} s "
          f"(vLLM's engine start: {float(UP.findall(srv.log.read_text())[-1][0]):.1f} s)")


def test_engine_hang_mid_stream_is_caught_by_the_watchdog(srv):
    before = restarts(srv)
    stream, resp, faulted, ended_s, old = fault_mid_stream(srv, signal.SIGSTOP)
    assert HANG_S - 1 < ended_s < HANG_S + ENDED_S, \
        f"clients ended {ended_s:.1f} s after the hang"
    check_failed_cleanly(srv, stream, resp, "engine_hung")
    back_s = check_recovered(srv, faulted + ended_s, old, before)  # the watchdog fired
    print(f"hang: clients answered {ended_s:.2f} s after the stop, served again "
          f"{back_s:.1f} s after that")
