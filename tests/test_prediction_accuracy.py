"""Accuracy as served has one rule (slo.predict.accuracy, docs/prediction.md): p50 MAPE
and p90 coverage over the requests that carry the prediction being judged, and the
share never predicted apart. `tailguard predict eval` and the console's Forecasts page
both show it, and for the same trace log they show the same numbers, to the last bit.

The log holds what made the two disagree before: predictions without a p90, answers
with a zero TPOT, requests no model predicted, and a refused request.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from click.testing import CliRunner

from dashboards.console import queries as Q
from observe.query import query_file
from observe.tracelog import TraceLog
from slo.predict.accuracy import never_predicted_line
from tests.test_cli_predict import REQUESTS, _request

DAY_MINUTES = 1440  # the console's widest window; every row below is in it
EDGE = 40  # rows of each odd kind


def _edge_rows(now: float) -> list[dict]:
    no_p90 = [{"request_id": f"p{i}", "status": "ok", "arrival_ts": now - 60 + i,
               "ttft_s": 0.1 + i / 1000, "tpot_s": 0.01, "predicted_ttft_s": 0.12,
               "predicted_tpot_s": 0.011, "predictor_version": "no-p90"}
              for i in range(EDGE)]
    zero_tpot = [{"request_id": f"z{i}", "status": "ok", "arrival_ts": now - 50 + i,
                  "ttft_s": 0.2, "tpot_s": 0.0 if i % 2 else 0.02, "predicted_ttft_s": 0.25,
                  "predicted_ttft_p90_s": 0.3 if i % 4 else 0.1, "predicted_tpot_s": 0.02,
                  "predicted_tpot_p90_s": 0.03, "predictor_version": "zero-tpot"}
                 for i in range(EDGE)]
    never = [{"request_id": f"n{i}", "status": "ok", "arrival_ts": now - 40 + i,
              "ttft_s": 0.3, "tpot_s": 0.01} for i in range(EDGE // 4)]
    refused = [{"request_id": "x1", "status": "rejected", "arrival_ts": now - 30,
                "predicted_ttft_s": 1.0, "predictor_version": "no-p90"}]
    return no_p90 + zero_tpot + never + refused


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("accuracy") / "trace.duckdb"
    rng, now = np.random.default_rng(11), time.time()
    with TraceLog(str(path)) as log:
        for i in range(REQUESTS):  # trainable rows, so `predict eval` has a model to load
            log.add("requests", {**_request(i, rng), "arrival_ts": now - 3700 + 5 * i})
        for row in _edge_rows(now):
            log.add("requests", row)
    return path


def _cell(text: str):
    return None if text == "NULL" else float(text)


@pytest.fixture(scope="module")
def cli_output(trace_file) -> str:
    from tailguard.cli import main

    runner = CliRunner()
    trained = runner.invoke(main, ["predict", "train", "--db", str(trace_file)])
    assert trained.exit_code == 0, trained.output
    result = runner.invoke(main, ["predict", "eval", "--db", str(trace_file)])
    assert result.exit_code == 0, result.output
    return result.stdout.split("as served (the rows' own predictions):\n")[1].rstrip("\n")


def test_the_console_and_the_cli_show_the_same_accuracy(trace_file, cli_output):
    lines = cli_output.splitlines()
    cli = [(row[0], int(row[1]), *map(_cell, row[2:])) for row in map(str.split, lines[2:-2])]
    console = query_file(trace_file, Q.prediction_accuracy(DAY_MINUTES)).rows
    assert cli == console
    assert [row[0] for row in cli] == ["seed-003", "hgb-test", "no-p90", "zero-tpot"]


def test_the_console_and_the_cli_count_the_never_predicted_alike(trace_file, cli_output):
    (served, never), = query_file(trace_file, Q.never_predicted(DAY_MINUTES)).rows
    assert (served, never) == (REQUESTS + 2 * EDGE + EDGE // 4, EDGE // 4)
    assert cli_output.splitlines()[-1] == never_predicted_line(served, never)


def test_only_requests_with_the_prediction_are_judged(trace_file):
    rows = {r[0]: r for r in query_file(trace_file, Q.prediction_accuracy(DAY_MINUTES)).rows}
    _, requests, _, ttft_coverage, _, tpot_coverage = rows["no-p90"]
    assert (requests, ttft_coverage, tpot_coverage) == (EDGE, None, None)  # no p90: no miss
    _, requests, _, ttft_coverage, tpot_mape, tpot_coverage = rows["zero-tpot"]
    assert requests == EDGE and ttft_coverage == 0.75  # every 4th p90 (0.1) is under 0.2
    assert (tpot_mape, tpot_coverage) == (0.0, 1.0)  # over the 20 answers with a TPOT > 0
