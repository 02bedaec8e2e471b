"""Tenants (slo/tenants.py): each finished request has one outcome for its client; the
live `tailguard_client_requests_total` counts them by the Python rule, the console and
`tailguard slo status --tenants` by the SQL twin, and a test holds the two equal. The
`client` column reaches older trace files too, written or read-only."""

from __future__ import annotations

import itertools
import json
import time

import duckdb
import pytest
from prometheus_client import CollectorRegistry

from observe import registry as R
from observe.metrics import RequestMetrics, create_prometheus_export
from observe.query import query_file
from observe.record import RequestRecord
from observe.schema import REQUESTS
from observe.stats import EngineTimes, WallClock
from observe.tracelog import TraceLog
from serving.keys import KeyRing, parse_keys
from serving.observer import Observer
from slo.loading import load_spec
from slo.tenants import (
    CLIENT_UNKNOWN,
    OUTCOMES,
    format_tenants,
    outcome,
    tenant_label,
    tenant_status,
)
from slo.verdicts import Judge

_IDS = itertools.count()
CLOCK = WallClock()  # rows land at the real wall-clock time: inside the last hour


class _NoSpans:
    def finish(self, rec, span) -> None:
        pass


@pytest.fixture
def observed():
    """An observer over a fresh Prometheus registry and an in-memory trace log, with
    the label set of a keys file naming alice and bob."""
    registry = CollectorRegistry()
    export = create_prometheus_export(registry)
    with TraceLog(":memory:") as log:
        metrics = RequestMetrics(export.provider.get_meter("test"))
        yield Observer(log, _NoSpans(), metrics, CLOCK, clients=("alice", "bob")), registry
    export.shutdown()


def _count(registry, client: str, outcome_: str) -> float | None:
    for family in registry.collect():
        for s in family.samples:
            if (s.name == R.CLIENT_REQUESTS.prom_name and s.labels.get("client") == client
                    and s.labels.get("outcome") == outcome_):
                return s.value
    return None


def _request(client: str | None, status: str = R.STATUS_OK, ttft: float = 0.05,
             actions: tuple[str, ...] = (), error_type: str | None = None,
             http_status: int = 200) -> RequestRecord:
    """A request that arrived 5 s ago: served with `ttft` (0.05 s: within every SLO of
    the shipped spec; 0.5 s: over the TTFT targets), or refused/failed as told."""
    rec = RequestRecord(f"t{next(_IDS)}", arrival=time.monotonic() - 5,
                        endpoint="text_completion", prompt_tokens=10, client=client,
                        policy_actions=list(actions))
    rec.end = rec.arrival + ttft + 0.1
    if status == R.STATUS_OK:
        first = rec.arrival + ttft
        rec.engine = EngineTimes(rec.arrival, rec.arrival, first, first)
        rec.first_token, rec.output_tokens = first, 1
    else:
        rec.fail(http_status, error_type or "x", "refused", status)
    return rec


# Each outcome, with its client: alice is served twice on time and once late and shed
# once by a policy; bob is shed by the limiter's timeout and by the deadline check, refused
# for his quota and failed by the engine; a caller without a valid key is unknown; carol is not in the
# label set (a name the keys file does not hold) and counts as unknown on /metrics.
def cases() -> list[tuple[RequestRecord, str]]:
    return [
        (_request("alice"), "good"),
        (_request("alice"), "good"),
        (_request("alice", ttft=0.5), "late"),
        (_request("alice", R.STATUS_REJECTED, actions=("shed:vip_only",), error_type="shed",
                  http_status=503), "shed"),
        (_request("bob", R.STATUS_REJECTED, error_type="admission_timeout", http_status=503),
         "shed"),
        (_request("bob", R.STATUS_REJECTED, actions=("refuse:deadline",), error_type="deadline",
                  http_status=429), "shed"),  # refused by the deadline check: paid too
        (_request("bob", R.STATUS_REJECTED, error_type="client_sequence_limit",
                  http_status=429), "rejected"),
        (_request("bob", R.STATUS_ERROR, error_type="engine_dead", http_status=503), "error"),
        (_request(None, R.STATUS_REJECTED, error_type="invalid_api_key", http_status=401),
         "rejected"),
        (_request("carol", R.STATUS_ABORTED, error_type="client_disconnected", http_status=499),
         "aborted"),
    ]


def test_every_finished_request_counts_once_per_client_and_outcome(observed):
    observer, registry = observed
    finished = cases()
    for rec, _ in finished:
        observer.finish(rec, None)
    assert [outcome(rec) for rec, _ in finished] == [want for _, want in finished]
    counts = {(c, o): _count(registry, c, o) for c in ("alice", "bob", CLIENT_UNKNOWN)
              for o in OUTCOMES}
    assert {k: v for k, v in counts.items() if v is not None} == {
        ("alice", "good"): 2.0, ("alice", "late"): 1.0, ("alice", "shed"): 1.0,
        ("bob", "shed"): 2.0, ("bob", "rejected"): 1.0, ("bob", "error"): 1.0,
        (CLIENT_UNKNOWN, "rejected"): 1.0, (CLIENT_UNKNOWN, "aborted"): 1.0}
    assert _count(registry, "carol", "aborted") is None  # never a label of its own


def test_the_sql_over_the_trace_log_gives_what_the_live_counters_count(observed):
    observer, _ = observed
    for rec, _ in cases():
        observer.finish(rec, None)
    observer.tracelog.flush()

    def query(sql):
        result = observer.tracelog.query(sql)
        return result.columns, result.rows

    tenants = {t.client: t.as_dict() for t in tenant_status(query)}
    # 5 s old: goodput is good / 5 s (a log younger than the window, by its own span).
    assert tenants["alice"].pop("goodput_rps") == pytest.approx(2 / 5, rel=0.1)
    nothing = dict(good=0, late=0, shed=0, rejected=0, error=0, aborted=0, attainment=None,
                   goodput_rps=0.0)
    # The log keeps carol's name: it is what the keys file said when she called.
    assert tenants == {
        "alice": dict(client="alice", requests=4, good=2, late=1, shed=1, rejected=0,
                      error=0, aborted=0, attainment=2 / 3),
        "bob": {**nothing, "client": "bob", "requests": 4, "shed": 2, "rejected": 1,
                "error": 1},
        CLIENT_UNKNOWN: {**nothing, "client": CLIENT_UNKNOWN, "requests": 1, "rejected": 1},
        "carol": {**nothing, "client": "carol", "requests": 1, "aborted": 1}}
    assert [t.client for t in tenant_status(query)] == ["alice", "bob", "carol",
                                                        CLIENT_UNKNOWN]


def test_the_label_set_is_the_keys_file_and_everything_else_is_unknown():
    ring = parse_keys("keys:\n  - {name: alice, key: sk-a}\n  - {name: bob, key: sk-b}\n")
    assert ring.names == {"alice", "bob"}
    assert KeyRing.open().names == {"anonymous"}
    assert [tenant_label(c, ring.names) for c in ("alice", "bob", "anonymous", "mallory",
                                                  None)] == [
        "alice", "bob", CLIENT_UNKNOWN, CLIENT_UNKNOWN, CLIENT_UNKNOWN]


def test_the_terminal_table_prints_every_outcome_attainment_and_goodput():
    rows = [dict(client="alice", requests=4, good=2, late=1, shed=1, rejected=0, error=0,
                 aborted=0, attainment=2 / 3, goodput_rps=0.5),
            dict(client="unknown", requests=1, good=0, late=0, shed=0, rejected=1, error=0,
                 aborted=0, attainment=None, goodput_rps=0.0)]
    assert format_tenants(rows) == (
        "tenants (last 3600 s):\n"
        "client   requests  good  late  shed  rejected  error  aborted  attainment  goodput\n"
        "alice    4         2     1     1     0         0      0        66.67%      0.500/s\n"
        "unknown  1         0     0     0     1         0      0        -           0.000/s\n")


def _old_file(path: str) -> None:
    """A trace log as tailguard wrote it before the `client` column, with one request."""
    columns = [(n, t) for n, t in REQUESTS.columns if n != "client"]
    with duckdb.connect(path) as conn:
        conn.execute(f"CREATE TABLE requests ({', '.join(f'{n} {t}' for n, t in columns)})")
        conn.execute("INSERT INTO requests (request_id, arrival_ts, status, http_status, "
                     "slo_ok) VALUES ('old', now() - INTERVAL 1 MINUTE, 'ok', 200, true)")


def test_an_older_trace_file_reads_as_unknown_and_gains_the_column_when_written(tmp_path):
    path = str(tmp_path / "old.duckdb")
    _old_file(path)

    def read(sql):
        result = query_file(path, sql)
        return result.columns, result.rows

    (old,) = tenant_status(read)  # read-only: no column to add, every request unknown
    assert (old.client, old.requests, old.good) == (CLIENT_UNKNOWN, 1, 1)
    with TraceLog(path) as log:  # a server opening it adds the column in place
        log.add("requests", _request("alice").row(CLOCK))
    assert query_file(path, "SELECT request_id, client FROM requests ORDER BY client "
                            "NULLS FIRST").rows[0] == ("old", None)
    assert {(t.client, t.requests) for t in tenant_status(read)} == {
        (CLIENT_UNKNOWN, 1), ("alice", 1)}


def test_slo_status_prints_the_tenant_table_after_its_own_lines_only_when_asked(tmp_path):
    from click.testing import CliRunner

    from tailguard.cli import main as tailguard

    path, judge = str(tmp_path / "trace.duckdb"), Judge(load_spec())
    with TraceLog(path) as log:
        for rec, _ in cases()[:4]:  # alice: good, good, late, shed
            judge.judge(rec)
            log.add("requests", rec.row(CLOCK))

    def run(*extra: str) -> str:
        result = CliRunner().invoke(tailguard, ["slo", "status", "--db", path, *extra])
        assert result.exit_code == 0, result.output
        return result.output

    plain, with_tenants = run().splitlines(), run("--tenants").splitlines()
    # The status lines as before (goodput moves on as time passes), then the table.
    assert with_tenants[:len(plain) - 1] == plain[:-1]
    assert with_tenants[len(plain) - 1].startswith("goodput (requests meeting every SLO)")
    table = with_tenants[len(plain):]
    assert table[0] == "tenants (last 3600 s):"
    assert table[2].split() == ["alice", "4", "2", "1", "1", "0", "0", "0", "66.67%",
                                table[2].split()[-1]]
    (alice,) = json.loads(run("--tenants", "--format", "json"))["tenants"]
    assert (alice["client"], alice["good"], alice["late"], alice["shed"]) == ("alice", 2, 1, 1)


def _verdicts(registry) -> dict[tuple[str, str, str], float]:
    return {(s.labels["slo"], s.labels["context_bucket"], s.labels["result"]): s.value
            for family in registry.collect() for s in family.samples
            if s.name == R.SLO_REQUESTS.prom_name}


def test_every_slo_verdict_series_exists_at_zero_before_the_first_request(observed):
    # A `bad` series born at its first bad event has no earlier sample for rate() to
    # compare with: after a restart the first miss of each SLO would never burn budget.
    _, registry = observed
    names = [slo.name for slo in load_spec().slos]
    expected = {(name, bucket, result): 0.0 for name in names
                for bucket in R.CONTEXT_BUCKETS for result in R.RESULTS}
    assert _verdicts(registry) == expected


def test_a_late_request_moves_its_bad_series_from_zero_to_one(observed):
    observer, registry = observed
    late = _request("alice", ttft=0.5)
    verdicts = len(Judge(load_spec()).judge(_request("alice", ttft=0.5)))
    observer.finish(late, None)
    after = _verdicts(registry)
    assert after[("ttft", "0-1k", "bad")] == 1.0
    assert after[("ttft", "0-1k", "good")] == 0.0
    assert after[("ttft", "1k-4k", "bad")] == 0.0
    assert sum(after.values()) == verdicts  # one count per verdict, the rest still 0
