"""How fast the trace-log writer takes and writes `requests` rows, and whether it stalls
the event loop.

Measures, on a fresh DuckDB file:
  1. add(): per-call cost (p50/p99 of individually timed calls, plus the bulk mean);
  2. flush throughput: one synchronous flush of all buffered rows (and the Arrow
     conversion alone, for scale), and a steady-state run where one thread adds as
     fast as it can while the background flusher drains with the default settings;
  3. event-loop lag: an asyncio loop with a 1 ms ticker while a coroutine add()s rows
     at a fixed rate and the background thread flushes; the baseline run is the same
     ticker without the writer (this machine's noise floor).
Optionally (--compare-insert) alternates the Arrow insert paths 3 times.

    python -m bench.tracelog.ingest --rows 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb

from bench.common import command_line
from observe import tracelog
from observe.schema import REQUESTS, arrow_table
from observe.tracelog import TraceLog

START = datetime(2025, 1, 1, tzinfo=timezone.utc)
POOL_SIZE = 20_000  # distinct rows, reused: a million dicts would measure the allocator


def request_row(i: int, rng: random.Random) -> dict:
    """A plausible finished request: every column set, as the server would send it."""
    prompt = rng.choice((40, 300, 900, 2000, 6000, 40_000)) + rng.randrange(40)
    output = rng.randrange(1, 256)
    queue, prefill = rng.expovariate(50), prompt * 2e-5
    decode, sampling = output * 0.011, output * 4e-4
    ok = rng.random() > 0.03
    return {
        "request_id": f"cmpl-{i:012x}", "trace_id": f"{rng.getrandbits(128):032x}",
        "arrival_ts": START + timedelta(microseconds=i * 997), "model": "tiny-llama",
        "endpoint": rng.choice(("/v1/completions", "/v1/chat/completions")),
        "stream": rng.random() < 0.6, "priority": rng.choice(("realtime", "batch")),
        "status": "ok" if ok else "rejected", "http_status": 200 if ok else 503,
        "error_type": None if ok else "overloaded",
        "error_message": None if ok else "shed by policy ttft_guard",
        "finish_reason": rng.choice(("length", "stop")) if ok else None,
        "prompt_tokens": prompt, "output_tokens": output, "max_tokens": 256,
        "context_bucket": "0-1k" if prompt < 1024 else "1k-4k" if prompt < 4096 else "4k-32k",
        "batch_bucket": "0-256", "queue_s": queue, "prefill_s": prefill, "decode_s": decode,
        "sampling_s": sampling, "ttft_s": queue + prefill, "tpot_s": 0.011,
        "e2e_s": queue + prefill + decode, "iterations": output, "avg_iter_s": 0.011,
        "preemptions": 0, "slo_ttft_target_s": 0.5, "slo_ok": ok,
        "policy_actions": [] if ok else ["shed"],
    }


def row_pool() -> list[dict]:
    rng = random.Random(7)
    return [request_row(i, rng) for i in range(POOL_SIZE)]


def fresh_log(workdir: Path, name: str, **config) -> TraceLog:
    return TraceLog(workdir / f"{name}.duckdb", **config)


def measure_add_and_flush(workdir: Path, rows: int, pool: list[dict]) -> dict:
    log = fresh_log(workdir, "bulk", flush_interval_s=3600, max_buffer_rows=rows + 1,
                    max_pending_rows=rows + 1)
    add, clock, timings = log.add, time.perf_counter_ns, []
    for i in range(rows // 2):  # first half: each call timed on its own
        row = pool[i % POOL_SIZE]
        started = clock()
        add("requests", row)
        timings.append(clock() - started)
    started = time.perf_counter()
    for i in range(rows // 2, rows):  # second half: bulk, no per-call clock overhead
        add("requests", pool[i % POOL_SIZE])
    bulk_s = time.perf_counter() - started
    timings.sort()
    columns = {name: list(values) for name, values in log._buffers["requests"].columns.items()}
    started = time.perf_counter()
    arrow_table(REQUESTS, columns, rows, tracelog.CONVERT_CHUNK_ROWS)
    convert_s = time.perf_counter() - started
    started = time.perf_counter()
    log.flush()
    flush_s = time.perf_counter() - started
    log.close()
    return {"add_p50_us": timings[len(timings) // 2] / 1e3,
            "add_p99_us": timings[int(len(timings) * 0.99)] / 1e3,
            "add_mean_us": bulk_s / (rows - rows // 2) * 1e6,
            "convert_rows_s": rows / convert_s, "flush_rows_s": rows / flush_s}


def measure_steady_state(workdir: Path, rows: int, pool: list[dict]) -> dict:
    log = fresh_log(workdir, "steady", max_pending_rows=rows + 1)  # default flush settings
    started = time.perf_counter()
    for i in range(rows):
        log.add("requests", pool[i % POOL_SIZE])
    log.flush()  # the remainder; waiting for the interval would measure the interval
    elapsed = time.perf_counter() - started
    flushes = log.stats()["flushes"]
    log.close()
    return {"steady_rows_s": rows / elapsed, "steady_flushes": flushes}


async def tick(duration_s: float, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    while loop.time() < deadline:
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - started - 0.001)


async def produce(log: TraceLog, rate: int, duration_s: float, pool: list[dict]) -> None:
    per_tick, sent = rate // 1000, 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    while loop.time() < deadline:
        for _ in range(per_tick):
            log.add("requests", pool[sent % POOL_SIZE])
            sent += 1
        await asyncio.sleep(0.001)


def measure_loop_lag(workdir: Path, rate: int, duration_s: float, pool: list[dict]) -> dict:
    async def run(with_writer: bool) -> list[float]:
        lags: list[float] = []
        if not with_writer:
            await tick(duration_s, lags)
            return lags
        with fresh_log(workdir, f"lag{rate}") as log:
            await asyncio.gather(tick(duration_s, lags), produce(log, rate, duration_s, pool))
        return lags

    baseline, loaded = asyncio.run(run(False)), asyncio.run(run(True))
    pct = lambda lags, q: statistics.quantiles(lags, n=1000)[int(q * 1000) - 1] * 1e3  # noqa: E731
    return {"lag_base_p99_ms": pct(baseline, 0.99), "lag_base_max_ms": max(baseline) * 1e3,
            "lag_p99_ms": pct(loaded, 0.99), "lag_max_ms": max(loaded) * 1e3}


def compare_insert_paths(workdir: Path, pool: list[dict], batch: int = 50_000) -> list[tuple]:
    """register + INSERT ... SELECT vs relation.insert_into, alternated 3 times."""
    columns = {n: [pool[i % POOL_SIZE].get(n) for i in range(batch)] for n in REQUESTS.column_names}
    table = arrow_table(REQUESTS, columns, batch)
    names = ", ".join(REQUESTS.column_names)
    results = []
    for attempt in range(3):
        for variant in ("register+INSERT", "from_arrow.insert_into"):
            path = workdir / f"cmp-{attempt}-{variant}.duckdb"
            with duckdb.connect(str(path)) as conn:
                conn.execute(REQUESTS.create_sql())
                started = time.perf_counter()
                for _ in range(10):
                    if variant == "register+INSERT":
                        conn.register("batch", table)
                        conn.execute(f"INSERT INTO requests ({names}) SELECT {names} FROM batch")
                        conn.unregister("batch")
                    else:
                        conn.from_arrow(table).insert_into("requests")
                results.append((attempt + 1, variant, 10 * batch / (time.perf_counter() - started)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=20_000, help="rows/s added in the lag test")
    parser.add_argument("--lag-seconds", type=float, default=5.0)
    parser.add_argument("--compare-insert", action="store_true")
    args = parser.parse_args()
    print("command: " + command_line(__spec__.name), flush=True)
    pool = row_pool()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        result = measure_add_and_flush(workdir, args.rows, pool)
        result |= measure_steady_state(workdir, args.rows, pool)
        result |= measure_loop_lag(workdir, args.rate, args.lag_seconds, pool)
        comparison = compare_insert_paths(workdir, pool) if args.compare_insert else []
    print(f"\n| metric ({args.rows:,} requests rows, duckdb {duckdb.__version__}) | value |")
    print("|---|---|")
    for label, key, unit in ROWS:
        print(f"| {label.format(rate=args.rate)} | {result[key]:,.{unit}f} |")
    if comparison:
        print("\n| run | insert path (50k-row Arrow batches) | rows/s |\n|---|---|---|")
        for attempt, variant, rate in comparison:
            print(f"| {attempt} | {variant} | {rate:,.0f} |")


ROWS = (
    ("add() p50, µs (each call timed)", "add_p50_us", 2),
    ("add() p99, µs (each call timed)", "add_p99_us", 2),
    ("add() mean, µs (bulk, untimed calls)", "add_mean_us", 2),
    ("Arrow conversion alone, rows/s", "convert_rows_s", 0),
    ("flush() of all buffered rows (convert + insert, one batch), rows/s", "flush_rows_s", 0),
    ("steady state add+background flush (defaults), rows/s", "steady_rows_s", 0),
    ("steady state flushes", "steady_flushes", 0),
    ("loop lag p99, ms, ticker alone", "lag_base_p99_ms", 2),
    ("loop lag max, ms, ticker alone", "lag_base_max_ms", 2),
    ("loop lag p99, ms, adding {rate} rows/s + flushing", "lag_p99_ms", 2),
    ("loop lag max, ms, adding {rate} rows/s + flushing", "lag_max_ms", 2),
)

if __name__ == "__main__":
    main()
