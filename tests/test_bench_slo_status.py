"""bench/tracelog/slo_status.py times the product's query path (`tailguard slo status --db`,
the same `compute_status` that `GET /admin/slo` runs), not SQL of its own."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import duckdb
import pytest

import observe.query
from bench.tracelog.slo_status import build, slo_status
from slo.budget import compute_status
from slo.loading import load_spec
from slo.report import status_to_dict


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.duckdb"
    build(path, 2_000, datetime.now(timezone.utc) - timedelta(minutes=1))
    return path


def test_the_bench_answers_what_compute_status_answers_on_the_same_file(trace):
    got = slo_status(trace)
    now = datetime.fromisoformat(got["now"])
    with duckdb.connect(str(trace), read_only=True) as conn:
        def query(sql):
            cur = conn.execute(sql)
            return [d[0] for d in cur.description], cur.fetchall()

        want = status_to_dict(compute_status(query, load_spec(), now))
    assert got == json.loads(json.dumps(want))
    assert sum(w["events"] for s in got["slos"] if not s["group"]
               for w in s["windows"][-1:]) > 0  # the file was read, not an empty answer


def test_the_bench_reads_the_file_through_the_product_query_function(trace, monkeypatch):
    calls = []
    real = observe.query.query_file

    def spy(path, sql, *args, **kwargs):
        calls.append(str(path))
        return real(path, sql, *args, **kwargs)

    monkeypatch.setattr(observe.query, "query_file", spy)
    slo_status(trace)
    assert calls == [str(trace)]  # one scan, by the CLI's own read-only path


def test_a_failing_status_command_fails_the_bench(tmp_path):
    with pytest.raises(RuntimeError, match="no such trace log"):
        slo_status(tmp_path / "missing.duckdb")


def test_the_query_bench_runs_every_documented_example_on_the_synthetic_log(trace):
    """bench/tracelog/query.py: every example of docs/trace-log.md, with now() the
    newest arrival, answers through the product's query function."""
    from bench.tracelog.query import example_queries, newest_arrival

    now = newest_arrival(trace)
    examples = example_queries(now)
    assert len(examples) >= 5 and all("now()" not in sql for _, sql in examples)
    assert all(title[0].isupper() for title, _ in examples)  # whole sentences, not tails
    for title, sql in examples:
        observe.query.query_file(trace, sql, timeout_s=60)  # raises on any failure
    assert now <= datetime.now(timezone.utc)
