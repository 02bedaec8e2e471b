"""`tailguard bench`: open-loop load against any OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from loadgen.workload import SCENARIOS


@click.command("bench")
@click.option("--url", required=True, help="Server base URL, e.g. http://127.0.0.1:8000")
@click.option("--scenario", type=click.Choice(SCENARIOS), default="steady", show_default=True)
@click.option("--rate", type=click.FloatRange(min=0.01), default=2.0, show_default=True,
              help="Requests/s at full load (burst peaks at 3x).")
@click.option("--duration", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds during which requests are sent.")
@click.option("--max-requests", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--output-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--model", help="Model id (default: the server's first model).")
@click.option("--api-key", default="unused", help="Bearer key sent with each request.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--period", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="diurnal: seconds of one compressed day.")
@click.option("--slo", "slo_file", type=click.Path(dir_okay=False),
              help="SLO spec for goodput (default: the shipped one).")
@click.option("--out", type=click.Path(file_okay=False), default="bench-out", show_default=True)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a TTY).")
def bench(url, scenario, rate, duration, max_requests, output_tokens, model, api_key, seed,
          period, slo_file, out, progress):
    """Drive load, then report P50/P95/P99 TTFT/TPOT/e2e per context bucket,
    throughput, goodput and errors (bench.json + bench.png in --out).

    Example: tailguard bench --url http://127.0.0.1:8000 --scenario mixed --rate 4 --duration 60
    """
    import httpx

    from loadgen import report as bench_report
    from loadgen import runner as loadgen
    from loadgen.workload import Workload
    from slo.loading import load_spec
    from slo.spec import SpecError

    try:
        spec = load_spec(slo_file)
        served, context = loadgen.discover(url, api_key)
        workload = Workload(scenario, rate, duration, max_requests,
                            max_context=context, output_tokens=output_tokens, seed=seed,
                            period_s=period)
    except (SpecError, ValueError) as exc:
        raise click.UsageError(str(exc))
    except httpx.HTTPError as exc:
        raise click.UsageError(f"cannot reach {url}: {exc}")
    target = loadgen.Target(url, model or served, api_key)
    results = asyncio.run(_run(target, workload, progress))
    offered = {"scenario": scenario, "rate": rate, "duration_s": duration, "seed": seed,
               "max_requests": max_requests, "output_tokens": output_tokens, "model": target.model,
               "period_s": period}
    summary = bench_report.summarize(results, spec, offered)
    paths = bench_report.write_outputs(Path(out), summary, results)
    sys.stdout.write(bench_report.format_summary(summary))
    click.echo("wrote " + ", ".join(str(p) for p in paths))


async def _run(target, workload, progress):
    from tqdm import tqdm

    from loadgen import runner as loadgen

    total = len(workload.arrivals())
    show = sys.stderr.isatty() if progress is None else progress
    with tqdm(total=total, disable=not show, unit="req", file=sys.stderr) as bar:
        return await loadgen.run(target, workload, on_done=lambda _: bar.update())
