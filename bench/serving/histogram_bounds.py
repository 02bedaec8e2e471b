"""Benchmark: what each latency-histogram choice costs in series per replica, and how
far Prometheus' P99 from it lands from the exact P99 of the same requests.

For every served request in the given trace logs, each latency the server records
into a histogram (`ttft_s`, `tpot_s`, `e2e_s`, `queue_s`, `prefill_s`, `decode_s`,
`sampling_s`) is binned into each choice's bounds, per context bucket, exactly as the
server's histograms count them; the P99 is then computed as Prometheus'
`histogram_quantile` does (linear inside the bucket the rank falls in, the highest
finite bound when it falls in +Inf) and compared with the exact P99
(`quantile_cont(x, 0.99)` in DuckDB). Cells with fewer than `--min-samples` requests
are left out. `native` is `serve --native-histograms` read by a Prometheus with its
native-histograms feature: schema 3 exponential buckets, one series per histogram and
context bucket, its P99 as Prometheus 2.42 computes it
(`observe.metrics.exponential.quantile`, held to a real Prometheus by
`tests/test_native_histograms.py`).

Then what a scrape costs: the recordings' latencies fed into the server's own
instruments (`fine` bounds, native buckets kept), `/metrics` written in the text and the
protobuf format, `--rounds` rounds of 20 scrapes each, order alternating, CPU time of
the thread.

    python -m bench.serving.histogram_bounds --db report.duckdb [--db more.duckdb]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import time

import duckdb

from observe import registry as R
from observe.metrics.exponential import Exponential, quantile
from slo.histogram_bounds import CHOICES, latency_buckets, series_per_replica
from slo.loading import load_spec

COLUMNS = {R.TTFT.prom_name: "ttft_s", R.TPOT.prom_name: "tpot_s", R.E2E.prom_name: "e2e_s",
           R.QUEUE.prom_name: "queue_s", R.PREFILL.prom_name: "prefill_s",
           R.DECODE.prom_name: "decode_s", R.SAMPLING.prom_name: "sampling_s"}


def histogram_quantile(q: float, bounds: tuple[float, ...], values: list[float]) -> float:
    """Prometheus' histogram_quantile over `values` counted into `bounds` (+Inf last)."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1  # le: a value equal to a bound is in it
    rank, seen = q * len(values), 0
    for i, count in enumerate(counts):
        if seen + count >= rank and count:
            if i == len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - seen) / count
        seen += count
    return bounds[-1]


def samples(dbs: list[str]) -> dict[tuple[str, str], list[float]]:
    """(histogram, context bucket) -> every served request's value, over all files."""
    out: dict[tuple[str, str], list[float]] = {}
    for db in dbs:
        conn = duckdb.connect(db, read_only=True)
        for name, column in COLUMNS.items():
            rows = conn.execute(f"SELECT context_bucket, {column} FROM requests "
                                f"WHERE status = 'ok' AND {column} IS NOT NULL").fetchall()
            for bucket, value in rows:
                out.setdefault((name, bucket), []).append(float(value))
        conn.close()
    return out


def exact_p99(values: list[float]) -> float:
    return duckdb.execute("SELECT quantile_cont(x, 0.99) FROM (SELECT unnest($v) AS x)",
                          {"v": values}).fetchone()[0]


def native_p99(values: list[float]) -> tuple[float, int]:
    """The P99 a native histogram of `values` gives, and how many buckets it fills."""
    histogram = Exponential()
    for value in values:
        histogram.observe(value)
    return quantile(0.99, histogram), len(histogram.counts) + bool(histogram.zero)


def scrape_cost(data: dict, rounds: int) -> None:
    """CPU ms a scrape, text against protobuf, alternating (see the module docstring)."""
    from prometheus_client import CollectorRegistry

    from observe.metrics import RequestMetrics, create_prometheus_export

    export = create_prometheus_export(CollectorRegistry(), native=True)
    metrics = RequestMetrics(export.provider.get_meter("tailguard"), None, True)
    for (name, bucket), values in data.items():
        for value in values:
            metrics.instruments[name].record(value, {R.LABEL_CONTEXT_BUCKET: bucket})
    sides = {"text": None, "protobuf": "application/vnd.google.protobuf;"
             "proto=io.prometheus.client.MetricFamily;encoding=delimited"}
    costs: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else reversed(list(sides))):
            start = time.thread_time()
            for _ in range(20):
                body, _ = export.exposition(sides[side])
            costs[side].append((time.thread_time() - start) / 20 * 1e3)
        print(f"round {r + 1}: text {costs['text'][-1]:.2f} ms, protobuf "
              f"{costs['protobuf'][-1]:.2f} ms of CPU a scrape")
    print("median: " + ", ".join(f"{side} {statistics.median(c):.2f} ms "
                                 f"[{min(c):.2f}-{max(c):.2f}]" for side, c in costs.items()))
    export.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", required=True, help="a trace log (repeatable)")
    ap.add_argument("--slo", help="SLO spec (default: the shipped one)")
    ap.add_argument("--min-samples", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="scrape-cost rounds")
    args = ap.parse_args()
    spec = load_spec(args.slo)
    data = {key: v for key, v in samples(args.db).items() if len(v) >= args.min_samples}
    choices = {choice: latency_buckets(spec, choice) for choice in CHOICES}
    print("| histogram | context bucket | requests | exact P99 (s) | "
          + " | ".join(f"{c}: P99 (error)" for c in (*CHOICES, "native")) + " |")
    print("|---|---|---:|---:|" + "---:|" * (len(CHOICES) + 1))
    errors: dict[str, list[float]] = {c: [] for c in (*CHOICES, "native")}
    filled: list[int] = []
    for (name, bucket), values in sorted(data.items()):
        exact = exact_p99(values)
        estimates = {choice: histogram_quantile(0.99, buckets[name], values)
                     for choice, buckets in choices.items()}
        estimates["native"], used = native_p99(values)
        filled.append(used)
        cells = []
        for choice, estimate in estimates.items():
            error = (estimate - exact) / exact if exact else 0.0
            errors[choice].append(abs(error))
            cells.append(f"{estimate:.4g} ({error:+.1%})")
        print(f"| {name} | {bucket} | {len(values)} | {exact:.4g} | " + " | ".join(cells) + " |")
    print()
    for choice, buckets in choices.items():
        errs = errors[choice]
        print(f"{choice}: {max(len(b) for b in buckets.values())} bounds at most, "
              f"{series_per_replica(buckets)} latency-histogram series per replica; "
              f"|P99 error| median {statistics.median(errs):.2%}, max {max(errs):.2%} "
              f"over {len(errs)} cells")
    errs = errors["native"]
    print(f"native: schema 3, {len(R.LATENCY_METRICS) * len(R.CONTEXT_BUCKETS)} latency-"
          f"histogram series per replica (buckets filled per cell: median "
          f"{statistics.median(filled):g}, max {max(filled)}); |P99 error| median "
          f"{statistics.median(errs):.2%}, max {max(errs):.2%} over {len(errs)} cells")
    print()
    scrape_cost(samples(args.db), args.rounds)


if __name__ == "__main__":
    main()
