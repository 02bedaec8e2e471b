"""The load generator's report: percentiles per context bucket, throughput, goodput
against the SLO spec's latency targets, errors by type; as JSON, text and a PNG."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from loadgen.runner import Result
from observe.registry import CONTEXT_BUCKETS, context_bucket
from slo.spec import LATENCY_SLIS, SLOSpec

PERCENTILES = (50, 95, 99)
METRICS = ("ttft_s", "tpot_s", "e2e_s")


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def meets_slos(result: Result, spec: SLOSpec) -> bool:
    """Good when ok and within every latency SLO's target for its prompt length."""
    if result.status != "ok":
        return False
    ctx = result.prompt_tokens or 0
    for slo in spec.slos:
        if slo.sli in LATENCY_SLIS:
            value = getattr(result, f"{slo.sli}_s")
            if value is not None and value > slo.target(ctx):
                return False
    return True


def summarize(results: list[Result], spec: SLOSpec, offered: dict) -> dict:
    ok = [r for r in results if r.status == "ok"]
    ends = [r.sent_s + r.e2e_s for r in ok if r.e2e_s is not None]
    wall = max(ends) - min(r.sent_s for r in results) if ends else 0.0
    good = [r for r in ok if meets_slos(r, spec)]
    return {
        "offered": offered,
        "requests": len(results), "ok": len(ok), "wall_s": wall,
        "throughput_rps": len(ok) / wall if wall else 0.0,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / wall if wall else 0.0,
        "goodput_rps": len(good) / wall if wall else 0.0,
        "slo_attainment": len(good) / len(results) if results else None,
        "errors": dict(Counter(r.error_type for r in results if r.status != "ok")),
        "latency": _latency_table(ok),
    }


def _latency_table(ok: list[Result]) -> dict:
    table = {}
    for bucket in ("all",) + CONTEXT_BUCKETS:
        rows = [r for r in ok if bucket == "all" or context_bucket(r.prompt_tokens or 0) == bucket]
        if not rows:
            continue
        entry = {"count": len(rows)}
        for metric in METRICS:
            values = [v for r in rows if (v := getattr(r, metric)) is not None]
            for p in PERCENTILES:
                entry[f"{metric[:-2]}_p{p}"] = percentile(values, p)
        table[bucket] = entry
    return table


def format_summary(summary: dict) -> str:
    lines = [f"requests {summary['requests']}  ok {summary['ok']}  "
             f"throughput {summary['throughput_rps']:.2f} req/s  "
             f"{summary['output_tokens_per_s']:.1f} tok/s  goodput {summary['goodput_rps']:.2f} req/s",
             "bucket   n      " + "  ".join(f"{m[:-2]} p{p}".ljust(10) for m in METRICS
                                            for p in PERCENTILES)]
    for bucket, entry in summary["latency"].items():
        cells = [_ms(entry[f"{m[:-2]}_p{p}"]).ljust(10) for m in METRICS for p in PERCENTILES]
        lines.append(f"{bucket:<8} {entry['count']:<6} " + "  ".join(cells))
    if summary["errors"]:
        lines.append("errors: " + ", ".join(f"{k} {v}" for k, v in summary["errors"].items()))
    return "\n".join(lines) + "\n"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}ms"


def write_outputs(out: Path, summary: dict, results: list[Result]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    report = out / "bench.json"
    rows = [{**asdict(r), "tpot_s": r.tpot_s, "token_times": None} for r in results]
    report.write_text(json.dumps({"summary": summary, "results": rows}, indent=1))
    return [report, _plot(out / "bench.png", results)]


def _plot(path: Path, results: list[Result]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for bucket in CONTEXT_BUCKETS:
        rows = [r for r in results if r.status == "ok"
                and context_bucket(r.prompt_tokens or 0) == bucket]
        if rows:
            axes[0].scatter([r.sent_s for r in rows], [r.ttft_s * 1000 for r in rows], s=8,
                            label=bucket)
            axes[1].scatter([r.sent_s for r in rows], [r.e2e_s for r in rows], s=8)
    failed = [r.sent_s for r in results if r.status != "ok"]
    if failed:
        axes[1].scatter(failed, [0] * len(failed), marker="x", color="red", label="error")
    axes[0].set_ylabel("TTFT (ms)")
    axes[1].set_ylabel("e2e (s)")
    axes[1].set_xlabel("request sent at (s)")
    axes[0].legend(title="context", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
