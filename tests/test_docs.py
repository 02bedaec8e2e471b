"""Generated documentation stays in sync with the registry."""

from pathlib import Path

from observe import docgen

ROOT = Path(__file__).resolve().parent.parent


def test_observation_doc_matches_the_registry():
    path = ROOT / "docs" / "observation.md"
    assert path.read_text() == docgen.rewrite(path), "run: python -m observe.docgen"


def test_every_metric_the_contract_names_is_in_the_registry():
    import re

    from observe import registry as R

    contract = (ROOT / "docs" / "CONTRACT.md").read_text()
    section = contract[contract.index("## Prometheus metrics"):]
    named = set(re.findall(r"`((?:gen_ai|tailguard)_[a-z0-9_]+)", section))
    assert named and named <= {m.prom_name for m in R.ALL_METRICS}


def test_every_example_query_in_the_trace_log_doc_runs(tmp_path):
    import re

    from observe.query import query_file
    from observe.tracelog import TraceLog

    path = tmp_path / "t.duckdb"
    TraceLog(str(path)).close()
    doc = (ROOT / "docs" / "trace-log.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc, re.S)
    assert len(queries) == 7
    for sql in queries:
        query_file(path, sql)
