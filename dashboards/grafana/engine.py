"""Engine: the running batch, the queue, KV-cache usage, batch sizes, request
outcomes, errors and trace-log rows dropped, and the server's event-loop lag, per
server instance."""

from __future__ import annotations

from dashboards.grafana.layout import Board
from dashboards.grafana.panels import (
    buckets_over_time,
    graph,
    legend_of,
    queries,
    steps,
    unit_of,
)
from dashboards.grafana.promql import bucket_counts, gauge, mean, quantile, rate, summed
from observe import registry as R

INSTANCE = ("instance",)


def build(_spec=None) -> dict:
    board = Board("tailguard engine",
                  "The vLLM engine behind each tailguard server: running batch, queue "
                  "depth, KV-cache usage, batch sizes, request outcomes and errors.")
    board.row("Scheduler")
    board.add(_gauge(R.RUNNING, "Running requests"), width=8)
    board.add(_gauge(R.WAITING, "Waiting requests (queue depth)"), width=8)
    board.add(kv_cache_usage(), width=8)
    board.row("Batching")
    board.add(buckets_over_time("Batch size heatmap", R.BATCH_SIZE.description,
                                unit_of(R.BATCH_SIZE), bucket_counts(R.BATCH_SIZE)))
    board.add(_batch_sizes())
    board.row("Requests and errors")
    board.add(_requests(), width=8)
    board.add(_errors(), width=8)
    board.add(_dropped_rows(), width=8)
    board.row("Server")
    board.add(_loop_lag())
    return board.to_json()


def kv_cache_usage():
    """KV-cache usage per instance, with the memory-pressure line."""
    return graph("KV-cache usage", R.KV_CACHE_USAGE.description, "percentunit",
                 queries((gauge(R.KV_CACHE_USAGE, INSTANCE), "{{instance}}")),
                 steps((0, "green"), (R.MEMORY_PRESSURE_RATIO, "red"))).min(0).max(1)


def _gauge(metric: R.MetricDef, title: str):
    return graph(title, metric.description, unit_of(metric),
                 queries((gauge(metric, INSTANCE), "{{instance}}")))


def _batch_sizes():
    pairs = [(mean(R.BATCH_SIZE, INSTANCE), "mean {{instance}}"),
             (quantile(0.5, R.BATCH_SIZE, INSTANCE), "p50 {{instance}}"),
             (quantile(0.95, R.BATCH_SIZE, INSTANCE), "p95 {{instance}}")]
    return graph("Batch size per engine step", R.BATCH_SIZE.description,
                 unit_of(R.BATCH_SIZE), queries(*pairs))


def _requests():
    return graph("Requests per second by status", R.REQUESTS.description, "reqps",
                 queries((rate(R.REQUESTS, (R.LABEL_STATUS,)), legend_of(R.LABEL_STATUS))))


def _errors():
    legend = f"{legend_of(R.LABEL_ERROR_TYPE)} ({legend_of(R.LABEL_HTTP_STATUS)})"
    return graph("Errors per second by type", R.ERRORS.description, "reqps",
                 queries((rate(R.ERRORS, (R.LABEL_ERROR_TYPE, R.LABEL_HTTP_STATUS)), legend)))


def _dropped_rows():
    expr = summed(R.TRACE_ROWS_DROPPED.prom_name, (R.LABEL_TABLE,), fn="increase")
    return graph("Trace-log rows dropped", R.TRACE_ROWS_DROPPED.description, "short",
                 queries((expr, legend_of(R.LABEL_TABLE))), steps((0, "green"), (1, "red")))


def _loop_lag():
    """The server's event-loop lag: p50 and p99 per instance, with the lines where it
    starts to add to the tail (1 ms at p99 healthy, 5 ms at saturation at most)."""
    pairs = [(quantile(0.5, R.EVENT_LOOP_LAG, INSTANCE), "p50 {{instance}}"),
             (quantile(0.99, R.EVENT_LOOP_LAG, INSTANCE), "p99 {{instance}}")]
    return graph("Event-loop lag", R.EVENT_LOOP_LAG.description, unit_of(R.EVENT_LOOP_LAG),
                 queries(*pairs), steps((0, "green"), (0.001, "orange"), (0.005, "red")))
