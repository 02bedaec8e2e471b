"""Durability of the trace log on a real server: a SIGKILL under load loses at most the
last flush interval (or, while the disk holds the spool's write longer, what came after
the last flush it let through: /admin/tracelog shows both, and every row the writer
said was durable is) and leaves a file that opens cleanly; a restarted server keeps the
old rows; a trace file that cannot be written, or a full disk, costs no request and,
once it can be written again, no row: the writer keeps what it could not write and
writes it then (one log line when writes fail, one when they recover).

Two server starts for the module: server A (default 1 s flush) is killed under load,
server B restarts on the same file and then has its writes fail. Everywhere (CI too):
a file-size limit (RLIMIT_FSIZE, set on the running server with prlimit(2); it binds
root, who ignores file modes) of 0 bytes makes every write fail, one at the current
WAL size leaves the files no room to grow, and raising it is the repair. Where the
trace file's own small filesystem can be mounted (an ext4 loop image, else a tmpfs)
it is also made immutable (`chattr +i`) and filled to ENOSPC; those cases skip, with
the reason, where the machine cannot build them.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from observe.query import query_file
from tests.conftest import ADMIN_TOKEN, DEFAULT_POLICIES, Server, _wait_ready, free_port

MODEL = "tailguard-tiny-llama"
FLUSH_S = 1.0  # server A runs with the default flush interval
MARGIN_S = 1.5  # a row is durable (in the spool) this long after its response completed
# An engine second (one engine_stats row a second) is durable this long after it
# closed: the flush interval, the row's own second, the margin.
ENGINE_SECOND_DURABLE_S = FLUSH_S + 1.0 + MARGIN_S
# Long enough to judge the engine seconds, and for rows to sit both in DuckDB and in the
# spool when the kill comes: the load (every sixty flushes, and before any read) is
# asked for by a reader's flush after LOADED_S.
LOAD_S = 10 * FLUSH_S + 5.0
LOADED_S = 10 * FLUSH_S
CLIENTS = 4
FS_SIZE = "64M"


# --- processes -----------------------------------------------------------------------

def _start(db: Path, log: Path, *extra: str) -> Server:
    """Like conftest.start_server, but in a session (process group) of its own, so a
    SIGKILL reaches the vLLM engine core and its workers too."""
    port = free_port()
    env = dict(os.environ, TAILGUARD_ADMIN_TOKEN=ADMIN_TOKEN)
    cmd = [sys.executable, "-m", "tailguard", "serve", "--port", str(port), "--db", str(db),
           "--retrain-interval", "0", "--reselect-interval", "0",
           "--policies", str(DEFAULT_POLICIES), *extra]
    # Through a pipe, copied here: a file-size limit on the server must not cut its log.
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True, bufsize=0)
    threading.Thread(target=shutil.copyfileobj, args=(process.stdout, log.open("wb", 0)),
                     daemon=True).start()
    server = Server(f"http://127.0.0.1:{port}", db, process, log)
    try:
        _wait_ready(server)
    except BaseException:
        _kill_group(server)
        raise
    return server


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[1], []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pids: set[int]) -> set[int]:
    """Those of `pids` still alive (a zombie waiting for its reaper is not)."""
    return {p for p in pids if (st := _stat(p)) is not None and st[0] not in "ZX"}


def _kill_group(server: Server) -> set[int]:
    """SIGKILL the server's process group; return the processes that survived 10 s."""
    tree = _descendants(server.process.pid) | {server.process.pid}
    try:
        os.killpg(server.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _running(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _running(tree)
    for pid in left:  # children of ours that left the group: never leave them behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# --- a small filesystem for the trace file -------------------------------------------

@dataclass
class SmallFs:
    path: Path
    kind: str  # "ext4-loop", "tmpfs" or "dir"
    why_not: list[str] = field(default_factory=list)  # why a better kind failed

    @property
    def mounted(self) -> bool:
        return self.kind != "dir"


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _mount_small_fs(tmp: Path) -> SmallFs:
    mnt = tmp / "fs"
    mnt.mkdir()
    why: list[str] = []
    if os.geteuid() != 0 or not shutil.which("mount"):
        return SmallFs(mnt, "dir", ["not root or no mount(8)"])
    image = tmp / "fs.img"
    if shutil.which("mkfs.ext4"):
        with image.open("wb") as f:
            f.truncate(64 * 1024 * 1024)
        made = _run("mkfs.ext4", "-q", "-m", "0", "-F", str(image))  # -m 0: no root reserve
        done = made if made.returncode else _run("mount", "-o", "loop", str(image), str(mnt))
        if done.returncode == 0:
            return SmallFs(mnt, "ext4-loop")
        why.append(f"ext4 loop image: {(done.stderr or done.stdout).strip()}")
        image.unlink(missing_ok=True)
    done = _run("mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(mnt))
    if done.returncode == 0:
        return SmallFs(mnt, "tmpfs", why)
    why.append(f"tmpfs: {done.stderr.strip()}")
    return SmallFs(mnt, "dir", why)


def _unmount(fs: SmallFs) -> None:
    if shutil.which("chattr"):
        _run("chattr", "-R", "-i", str(fs.path))
    if fs.mounted and _run("umount", str(fs.path)).returncode != 0:
        _run("umount", "-l", str(fs.path))


# --- load ----------------------------------------------------------------------------

@dataclass
class Killed:
    fs: SmallFs
    db: Path
    done: dict[str, float]  # request id -> monotonic time its response completed
    killed_at: float
    left_running: set[int]
    tree: set[int]
    rows: set[str]  # request ids in the file after the kill
    tables: dict[str, int]
    ready_wall: float  # time.time() when the server answered ready
    killed_wall: float
    newest_engine_second: float | None  # epoch of the newest engine_stats row in the file
    writer: list[tuple[float, dict]]  # (monotonic time asked, GET /admin/tracelog)

    def writer_summary(self) -> str:
        """How the server's trace writer kept up: what a failure here needs to tell."""
        if not self.writer:
            return "writer: never answered"
        gap, last_t, last_n = 0.0, self.writer[0][0], self.writer[0][1]["flushes"]
        for t, stats in self.writer:
            if stats["flushes"] != last_n:
                last_t, last_n = t, stats["flushes"]
            gap = max(gap, t - last_t)
        return (f"writer: {len(self.writer)} polls, {last_n} flushes, longest without a "
                f"flush {gap:.1f} s, max last_flush_s "
                f"{max(s['last_flush_s'] for _, s in self.writer):.3f}, "
                f"{self.writer[-1][1]['loads']} loads, max last_load_s "
                f"{max(s['last_load_s'] for _, s in self.writer):.3f}, max pending rows "
                f"{max(s['pending_rows'] for _, s in self.writer)}, "
                f"{self.killed_at - last_t:.1f} s since the last flush at the kill; at the "
                f"last poll: flush running {self.writer[-1][1]['flush_running_s']:.2f} s, "
                f"spool write {self.writer[-1][1]['spool_write_running_s']:.2f} s")

    def durable_before(self) -> float:
        """The monotonic time before which the writer, at its last poll, had every row
        durable (the start of its last flush that spooled them all)."""
        asked, stats = self.writer[-1]
        return asked - stats["last_flush_age_s"]

    def disk_held_s(self) -> float:
        """How long the disk had held the spool's write at the last poll: 0 unless the
        flush running then reached that write within half an interval (time spent
        short of it, converting rows or waiting for a lock, is ours to answer for)."""
        last = self.writer[-1][1]
        held, running = last["spool_write_running_s"], last["flush_running_s"]
        return held if held > 0 and running - held < FLUSH_S / 2 else 0.0


def _watch_writer(url: str, stop: threading.Event, seen: list) -> None:
    with httpx.Client(base_url=url, timeout=5,
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        while not stop.wait(0.25):
            asked = time.monotonic()  # before: `asked - last_flush_age_s` errs early
            try:
                seen.append((asked, client.get("/admin/tracelog").json()))
            except (httpx.HTTPError, ValueError):
                continue  # the kill cuts it too


def _load(url: str, stop: threading.Event, done: dict[str, float], errors: list) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                resp = client.post("/v1/completions", json={
                    "model": MODEL, "prompt": f"word {n} " * 8, "max_tokens": 4,
                    "ignore_eos": True})
            except httpx.HTTPError:
                continue  # the kill cuts requests in flight
            finished = time.monotonic()
            if resp.status_code == 200:
                done[resp.headers["x-request-id"]] = finished
            else:
                errors.append((resp.status_code, resp.text[:200]))


@pytest.fixture(scope="module")
def small_fs(tmp_path_factory):
    fs = _mount_small_fs(tmp_path_factory.mktemp("durable"))
    yield fs
    _unmount(fs)


@pytest.fixture(scope="module")
def killed(small_fs) -> Killed:
    db = small_fs.path / "trace.duckdb"
    server = _start(db, small_fs.path.parent / "a.log", "--flush-interval", str(FLUSH_S))
    ready_wall = time.time()
    stop, done, errors = threading.Event(), {}, []
    threads = [threading.Thread(target=_load, args=(server.url, stop, done, errors),
                                daemon=True) for _ in range(CLIENTS)]
    writer: list[tuple[float, dict]] = []
    threads.append(threading.Thread(target=_watch_writer, args=(server.url, stop, writer),
                                    daemon=True))
    try:
        for thread in threads:
            thread.start()
        time.sleep(LOADED_S)
        _flush(server)  # what a reader does: the rows so far into DuckDB
        time.sleep(LOAD_S - LOADED_S)
        tree = _descendants(server.process.pid) | {server.process.pid}
        killed_at, killed_wall = time.monotonic(), time.time()
        left = _kill_group(server)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=35)
        if server.process.poll() is None:
            _kill_group(server)
    assert not errors, errors[:5]
    # Opens cleanly: DuckDB replays the WAL (read-only: into memory, the file untouched).
    with duckdb.connect(str(db), read_only=True) as conn:
        in_duckdb = conn.execute("SELECT count(*) FROM requests").fetchall()[0][0]
    # The rows of the last flushes are in the spool: the CLI's read (a writer's open)
    # loads them into the file.
    assert in_duckdb > 0  # the reader's flush put the first ten seconds' rows there
    assert query_file(db, "SELECT count(*) FROM requests").rows[0][0] >= in_duckdb
    # ...and leaves no frame in it. An empty spool may stay: a kill just after a load
    # emptied it (the CI's run once did) leaves a 0-byte file, which a reader must not
    # remove (a server may hold it open).
    spool = Path(f"{db}.spool")
    assert not spool.exists() or spool.stat().st_size == 0
    with duckdb.connect(str(db), read_only=True) as conn:
        rows = {rid for (rid,) in conn.execute("SELECT request_id FROM requests").fetchall()}
        tables = {name: conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
                  for (name,) in conn.execute("SELECT table_name FROM duckdb_tables()")
                  .fetchall()}
        newest = conn.execute("SELECT epoch(max(ts)) FROM engine_stats").fetchone()[0]
    return Killed(small_fs, db, dict(done), killed_at, left, tree, rows, tables, ready_wall,
                  killed_wall, newest, writer)


@pytest.fixture(scope="module")
def restarted(killed):
    server = _start(killed.db, killed.fs.path.parent / "b.log", "--flush-interval", "0.2")
    yield server
    _kill_group(server)  # a graceful stop adds ~6 s of vLLM shutdown; nothing checks it


def completion(server: Server, words: int = 6) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "word " * words, "max_tokens": 2})


def dropped(server: Server) -> dict[str, float]:
    """`tailguard_trace_rows_dropped_total` by table, as /metrics shows it now."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tailguard_trace_rows_dropped_total":
                table = sample.labels["table"]
                out[table] = out.get(table, 0) + sample.value
    return out


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)


# --- kill -9 -------------------------------------------------------------------------

def test_kill_9_leaves_no_process_behind(killed):
    assert len(killed.tree) >= 2, "expected the vLLM engine core as a child process"
    assert killed.left_running == set(), "processes survived the group SIGKILL"
    assert _running(killed.tree) == set()


def test_kill_9_under_load_loses_at_most_the_last_flush_interval(killed):
    done, cut = killed.done, killed.killed_at
    assert len(done) >= 40, f"too little load to judge: {len(done)} requests completed"
    durable = {rid for rid, t in done.items() if t < cut - MARGIN_S}
    missing = sorted(durable - killed.rows)
    bands = []
    for lo, hi in ((0, FLUSH_S), (FLUSH_S, MARGIN_S), (MARGIN_S, float("inf"))):
        band = {rid for rid, t in done.items() if lo <= cut - t < hi}
        bands.append(f"{lo:g}-{hi:g} s before: {len(band - killed.rows)}/{len(band)} lost")
    print(f"\nkill -9: {len(done)} requests completed, {len(killed.rows)} rows in the file "
          f"({killed.fs.kind}); " + "; ".join(bands) + f"; tables {killed.tables}; "
          + killed.writer_summary())
    # What the writer said was durable is (it adds a request's row before answering).
    said = sorted(rid for rid, t in done.items() if t < killed.durable_before()
                  and rid not in killed.rows)
    assert not said, f"{len(said)} requests the writer had made durable have no row: {said[:5]}"
    if missing:  # only a disk that holds the spool's write may stretch the bound
        assert killed.disk_held_s() > 0, (
            f"{len(missing)} of {len(durable)} requests completed more than {MARGIN_S} s "
            f"before the kill have no row, and the disk did not hold the spool's write: "
            f"{missing[:5]}")
        print(f"the disk held the spool's write {killed.disk_held_s():.1f} s: "
              f"{len(missing)} requests completed before it began are not durable")
    # The file holds nothing the clients did not see complete (or see cut off).
    assert killed.tables["requests"] == len(killed.rows)
    assert killed.tables["spans"] > 0


def test_kill_9_loses_at_most_the_last_flush_interval_of_engine_seconds(killed):
    """engine_stats rows are spooled every flush like every other table's (they were
    written every ten flushes before the spool: an INSERT a second for one row was half
    of an idle server's CPU): what a kill loses of them is bounded by a flush."""
    assert killed.killed_wall - killed.ready_wall > ENGINE_SECOND_DURABLE_S  # can judge
    assert killed.newest_engine_second is not None, (
        f"no engine second in the file; {killed.writer_summary()}")
    lag = killed.killed_wall - killed.newest_engine_second
    bound = ENGINE_SECOND_DURABLE_S
    if killed.disk_held_s() > 0:  # as for requests: from the last flush the disk let by
        bound = max(bound, killed.killed_at - killed.durable_before() + 1.0 + MARGIN_S)
    assert lag <= bound, (f"the newest engine second is {lag:.1f} s old (bound {bound:.1f} "
                          f"s); {killed.writer_summary()}")


def test_a_restarted_server_serves_and_keeps_the_old_rows(killed, restarted):
    resp = completion(restarted)
    assert resp.status_code == 200, resp.text
    rid = resp.headers["x-request-id"]
    ids = {r["request_id"] for r in restarted.sql("SELECT request_id FROM requests")}
    assert killed.rows <= ids
    assert ids - killed.rows == {rid}


# --- a read-only trace file and a full disk ------------------------------------------

def _immutable(paths: list[Path], on: bool) -> None:
    done = _run("chattr", "+i" if on else "-i", *map(str, paths))
    assert done.returncode == 0, done.stderr


def _immutability_holds_for_open_files(directory: Path) -> str | None:
    """None when `chattr +i` makes writes through an already-open file fail here
    (what the server's DuckDB has); else why the case must be skipped."""
    if not shutil.which("chattr"):
        return "no chattr(1)"
    probe = directory / "probe"
    with probe.open("ab") as f:
        if _run("chattr", "+i", str(probe)).returncode != 0:
            return f"chattr +i is not supported on {directory}"
        try:
            f.write(b"x")
            f.flush()
            return f"chattr +i does not stop writes through open files on {directory}"
        except OSError:
            return None
        finally:
            _run("chattr", "-i", str(probe))
            probe.unlink()


def _flush(server: Server) -> dict:
    """Write every buffered and kept row now, if the file takes them; the writer's stats."""
    return server.admin("/admin/flush")


def _streaks(log: str, what: str) -> tuple[int, int]:
    """How often `what` was logged for DuckDB and for the spool ("spool " + what)."""
    spool = log.count(f"spool {what}")
    return log.count(what) - spool, spool


def _failure_phase(server: Server, make_fail, undo, expected_error: str,
                   one_streak: bool = True) -> int:
    """Break the file; serving must go on, the writer must keep every row it could not
    write (none dropped, on the writer or on /metrics) and log the failure once; then
    repair it: every row of every answered request is in the file exactly once.
    `one_streak=False` where a write may get through mid-phase (a full disk frees the
    space of a failed commit). Returns the rows kept while the file was broken."""
    before = _flush(server)
    metrics_before = dropped(server)
    log_start = server.log.stat().st_size
    make_fail()
    try:
        ids = []
        for _ in range(6):
            resp = completion(server)
            assert resp.status_code == 200, resp.text
            ids.append(resp.headers["x-request-id"])
            _flush(server)  # a failed write per request: still one log line
        assert httpx.get(server.url + "/readyz", timeout=10).status_code == 200
        broken = _flush(server)
        assert broken["pending_rows"] >= len(ids)  # kept: at least the request rows
        assert broken["rows_dropped"] == before["rows_dropped"]
        time.sleep(1.5)  # /metrics follows the writer's counts once a second
        assert dropped(server) == metrics_before
        log = server.log.read_text()[log_start:]  # the log comes through a pipe:
        assert expected_error in log, log[-2000:]  # by now (1.5 s) it is all here
        if one_streak:  # DuckDB's failure once; the spool's at most once (its own file)
            assert _streaks(log, "write failed, keeping rows") in ((1, 0), (1, 1)), log[-3000:]
            assert "writes recovered" not in log
    finally:
        undo()
    assert server.process.poll() is None, "the server died"
    resp = completion(server)
    assert resp.status_code == 200, resp.text
    ids.append(resp.headers["x-request-id"])
    repaired = _flush(server)
    assert repaired["rows_dropped"] == before["rows_dropped"]  # nothing lost for good
    wait_for(lambda: "writes recovered" in server.log.read_text()[log_start:], 15,
             "the writer logs its recovery")
    if one_streak:  # each failure streak logged once, and its recovery once
        log = server.log.read_text()[log_start:]
        failed = _streaks(log, "write failed")
        assert failed == _streaks(log, "writes recovered") and failed[0] == 1, log[-3000:]
    quoted = ", ".join(f"'{i}'" for i in ids)
    rows = server.sql(f"SELECT request_id, count(*) AS n FROM requests "
                      f"WHERE request_id IN ({quoted}) GROUP BY 1")
    assert {r["request_id"]: r["n"] for r in rows} == dict.fromkeys(ids, 1)
    spans = server.sql(f"SELECT count(DISTINCT request_id) AS n FROM spans "
                       f"WHERE request_id IN ({quoted})")
    assert spans == [{"n": len(ids)}]
    return broken["pending_rows"]


def _file_size_limit(server: Server, limit: int):
    """(make_fail, undo): the server's RLIMIT_FSIZE lowered to `limit` bytes, then
    raised back (its hard limit is untouched, so no privilege is needed)."""
    pid = server.process.pid
    saved = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    return (lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, saved[1])),
            lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, saved))


def test_a_trace_file_nothing_can_be_written_to_costs_no_request_and_no_row(restarted):
    # 0 bytes: every write fails with EFBIG, in place or at the end, as on a file
    # that turned read-only. Without SIGXFSZ ignored the server would die here.
    kept = _failure_phase(restarted, *_file_size_limit(restarted, 0), "File too large")
    print(f"\nfile-size limit 0: {kept} rows kept in memory, then written")


def test_a_trace_file_with_no_room_to_grow_costs_no_request_and_no_row(restarted):
    _flush(restarted)
    wal = restarted.db.with_name(restarted.db.name + ".wal")
    limit = wal.stat().st_size if wal.exists() else 0  # the WAL cannot take one commit
    kept = _failure_phase(restarted, *_file_size_limit(restarted, limit), "File too large")
    print(f"\nfile-size limit at the WAL's {limit} bytes: {kept} rows kept, then written")


def test_a_read_only_trace_file_costs_no_request_and_no_row(restarted):
    directory = restarted.db.parent
    why = _immutability_holds_for_open_files(directory)
    if why:
        pytest.skip(why)
    # Root ignores file modes (chmod 0444 changes nothing); the immutable flag holds.
    targets = [p for p in directory.iterdir() if p.name.startswith(restarted.db.name)]
    targets.append(directory)
    _failure_phase(restarted, lambda: _immutable(targets, True),
                   lambda: _immutable(targets, False), "Operation not permitted")


def test_a_full_disk_costs_no_request_and_no_row(small_fs, restarted):
    if not small_fs.mounted:
        pytest.skip("cannot mount a small filesystem to fill: " + "; ".join(small_fs.why_not))
    filler = small_fs.path / "filler"

    def fill() -> None:
        with filler.open("wb", buffering=0) as f:
            for chunk in (1 << 20, 1 << 12):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
            os.fsync(f.fileno())
        assert shutil.disk_usage(small_fs.path).free < 64 * 1024

    # A failed commit gives its space back, so a small batch may still fit now and then.
    kept = _failure_phase(restarted, fill, filler.unlink, "No space left on device",
                          one_streak=False)
    print(f"\ndisk full ({small_fs.kind}): {kept} rows kept in memory, then written")
