"""Latency by context bucket: P50/P95/P99 of every latency histogram per
`context_bucket`, heatmaps of TTFT and end-to-end latency, the distribution of
prompt lengths, and the latency predictor's live p90 coverage and p50 MAPE."""

from __future__ import annotations

from dashboards.grafana.layout import Board, choice_variable
from dashboards.grafana.panels import (
    buckets_in_range,
    buckets_over_time,
    graph,
    legend_of,
    queries,
    steps,
    unit_of,
)
from dashboards.grafana.promql import (
    QUANTILES,
    bucket_counts,
    gauge,
    matchers,
    percentile_legend,
    mean,
    quantile,
    rate,
    summed,
)
from observe import registry as R

BUCKET = R.LABEL_CONTEXT_BUCKET  # the label, and the dashboard variable named after it
SELECTED = matchers(**{BUCKET: "~$" + BUCKET})
# Panel titles of the latency histograms, in the registry's order.
TITLES = {
    R.TTFT.prom_name: "Time to first token",
    R.TPOT.prom_name: "Time per output token",
    R.E2E.prom_name: "End-to-end latency",
    R.QUEUE.prom_name: "Queue time",
    R.PREFILL.prom_name: "Prefill time",
    R.DECODE.prom_name: "Decode time",
    R.SAMPLING.prom_name: "Sampling time",
}
HEATMAPS = (R.TTFT, R.E2E)


def build(_spec=None) -> dict:
    board = Board("tailguard latency by context bucket",
                  "P50/P95/P99 of every request phase per context bucket (seed 003's "
                  "0-1k / 1k-4k / 4k-32k / 32k+), latency heatmaps and prompt lengths.",
                  (choice_variable(BUCKET, "Context bucket", R.CONTEXT_BUCKETS),))
    board.row("Quantiles per context bucket")
    for metric in R.LATENCY_METRICS:
        board.add(_quantiles(metric))
    board.row("Distributions")
    for metric in HEATMAPS:
        board.add(buckets_over_time(f"{TITLES[metric.prom_name]} heatmap",
                                    metric.description, unit_of(metric),
                                    bucket_counts(metric, SELECTED)))
    _context_lengths(board)
    board.row("Latency prediction, judged live")
    board.add(_coverage())
    board.add(_errors())
    return board.to_json()


def _coverage():
    """p90 coverage per target and bucket, with the alert's floor."""
    pairs = [(f"{rate(within, (BUCKET,), SELECTED)} / {rate(judged, (BUCKET,), SELECTED)}",
              f"{target.removesuffix('_s').upper()} {legend_of(BUCKET)}")
             for target, (_, judged, within) in R.PREDICTION_METRICS.items()]
    return graph("Prediction p90 coverage", "Share of judged requests at or under their "
                 "predicted p90 (goal 90%; TailguardPredictionCoverageLow below "
                 f"{R.PREDICTION_COVERAGE_MIN:.0%}).", "percentunit", queries(*pairs),
                 steps((0, "red"), (R.PREDICTION_COVERAGE_MIN, "green")))


def _errors():
    """p50 MAPE per target and bucket: the error histogram's mean."""
    pairs = [(mean(error, (BUCKET,), SELECTED),
              f"{target.removesuffix('_s').upper()} {legend_of(BUCKET)}")
             for target, (error, _, _) in R.PREDICTION_METRICS.items()]
    return graph("Prediction p50 MAPE", "Mean of |predicted p50 - actual| / actual over "
                 "the served requests judged in the rate interval.", "percentunit",
                 queries(*pairs))


def _quantiles(metric: R.MetricDef):
    pairs = [(quantile(q, metric, (BUCKET,), SELECTED),
              f"{percentile_legend(q)} {legend_of(BUCKET)}") for q in QUANTILES]
    return graph(f"{TITLES[metric.prom_name]} P50/P95/P99", metric.description,
                 unit_of(metric), queries(*pairs))


def _context_lengths(board: Board) -> None:
    tokens = R.CONTEXT_TOKENS
    board.add(buckets_over_time("Prompt length heatmap", tokens.description,
                                unit_of(tokens), bucket_counts(tokens)))
    in_range = summed(f"{tokens.prom_name}_bucket", ("le",), fn="increase",
                      window="$__range")
    board.add(buckets_in_range("Prompt length distribution (time range)",
                               "Requests per prompt-length bucket over the dashboard's "
                               "time range; each bar is labelled with its upper bound.",
                               unit_of(tokens), in_range))
    board.add(graph("Requests per second by context bucket", R.REQUESTS.description,
                    "reqps", queries((rate(R.REQUESTS, (BUCKET,), SELECTED),
                                      legend_of(BUCKET)))), width=24)
    bounds = R.LENGTH_CLASS_BOUND  # seed 000: re-bucketed every 5 s from p25 / p75
    board.add(graph("Length-class boundaries (seed 000)", bounds.description,
                    unit_of(bounds), queries((gauge(bounds, ("instance", R.LABEL_BOUND)),
                                              "{{bound}} {{instance}}"))))
