"""The overhead benchmark's report: per comparison a table of medians with the per-round
ratio's median and spread, the per-round and per-process ratios, all rounds against the
quiet ones, the CPU time per observed request and the sanity checks."""

from __future__ import annotations

import statistics

from bench.serving.overhead_sides import SIDES
from bench.serving.overhead_worker import PINNED_LIMIT


def spread(values: list[float], fmt: str) -> str:
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def table(rounds: list[dict], a: str, b: str) -> list[str]:
    """metric | side a | side b | ratio b/a per round: median [min-max]."""
    med = lambda side, key: statistics.median(r[side][key] for r in rounds)  # noqa: E731
    ms = lambda v: f"{v * 1000:.0f} ms"  # noqa: E731
    lines = [f"| metric | {a} | {b} | {b}/{a} per round: median [min-max] |",
             "|---|---:|---:|---:|"]
    for key, label, fmt, rfmt in (
            ("tok_s", "generated tokens/s", lambda v: f"{v:.0f}", "{:.4f}"),
            ("ttft_p50", "TTFT p50", ms, "{:.3f}"),
            ("ttft_p99", "TTFT p99", ms, "{:.3f}"),
            ("server_ms_per_req", "server-process CPU per request", lambda v: f"{v:.2f} ms",
             "{:.3f}")):
        ratios = [r[b][key] / r[a][key] for r in rounds]
        lines.append(f"| {label} | {fmt(med(a, key))} | {fmt(med(b, key))} | "
                     f"{spread(ratios, rfmt)} |")
    return lines


RATIOS = (("observed", "bare"), ("on", "off"), ("bare", "off"), ("observed", "off"))


def report(args, command: str, results: list[dict], elapsed: float) -> None:
    rounds = [r for res in results for r in res["rounds"] if r["round"] > 0]
    print()
    print(f"### tailguard overhead: {args.concurrency} concurrent requests, prompts "
          f"{args.prompt_min}-{args.prompt_max} tokens, {args.max_tokens} output tokens "
          f"(ignore_eos, greedy), {args.batches} batches per side-turn; {len(rounds)} "
          f"measured rounds over {len(results)} process(es). Values: median over rounds; "
          "ratios: per round, median [min-max].")
    comparisons(rounds, args.control)
    per_round(rounds)
    per_process(results)
    quiet_rounds(rounds, args.quiet)
    cpu_and_checks(results, rounds)
    print(f"elapsed {elapsed:.0f} s")
    print()
    print(f"reproduce: {command}")


def tok_ratios(rounds: list[dict], b: str, a: str) -> list[float]:
    return [r[b]["tok_s"] / r[a]["tok_s"] for r in rounds]


def foreign_load(round_: dict) -> float:
    """The most CPU other processes took during any turn of the round, in cores."""
    return max(round_[s]["foreign"] for s in SIDES)


def comparisons(rounds: list[dict], control: bool) -> None:
    for title, a, b in (
            ("1. Observation path on one Runtime engine (bare generate vs observed)",
             "bare", "observed"),
            ("2. Step probe in the engine (plain engines, probe off vs on)"
             + (" -- CONTROL RUN: 'on' has NO probe" if control else ""), "off", "on"),
            ("3. End to end: plain vLLM engine vs tailguard Runtime, observed",
             "off", "observed")):
        print()
        print(title)
        print()
        print("\n".join(table(rounds, a, b)))


def per_round(rounds: list[dict]) -> None:
    print()
    print("per-round tokens/s ratios (and the most CPU other processes took during any "
          "turn of the round, in cores of 2):")
    for b, a in RATIOS:
        print(f"  {b + '/' + a:13s} " + " ".join(f"{x:.3f}" for x in tok_ratios(rounds, b, a)))
    print(f"  {'foreign load':13s} " + " ".join(f"{foreign_load(r):.3f}" for r in rounds))


def per_process(results: list[dict]) -> None:
    print("per-process medians of the tokens/s ratios (engines started in the order shown):")
    for res in results:
        rs = [r for r in res["rounds"] if r["round"] > 0]
        start = " > ".join(res["start_order"])
        print(f"  proc {rs[0]['proc']} ({start}): " + ", ".join(
            f"{b}/{a} {statistics.median(tok_ratios(rs, b, a)):.3f}" for b, a in RATIOS))


def quiet_rounds(rounds: list[dict], threshold: float) -> None:
    quiet = [r for r in rounds if foreign_load(r) < threshold]
    print()
    print(f"tokens/s ratios, all rounds vs quiet rounds (other processes under "
          f"{threshold} cores in every turn):")
    print()
    print(f"| ratio | all rounds (n={len(rounds)}) | quiet rounds (n={len(quiet)}) |")
    print("|---|---:|---:|")
    for b, a in RATIOS:
        q = spread(tok_ratios(quiet, b, a), "{:.4f}") if quiet else "-"
        print(f"| {b}/{a} | {spread(tok_ratios(rounds, b, a), '{:.4f}')} | {q} |")
    print()


def cpu_and_checks(results: list[dict], rounds: list[dict]) -> None:
    d = {k: sum(res["diag"][k] for res in results) for k in results[0]["diag"]}
    n = max(d["observed_requests"], 1)
    print("CPU time per observed request (thread CPU, during observed side-turns): "
          f"observer.begin {1e6 * d['begin_cpu_s'] / n:.0f} us, "
          f"observer.finish {1e6 * d['finish_cpu_s'] / n:.0f} us (event loop); "
          f"step consumers {1e6 * d['steps_cpu_s'] / n:.0f} us "
          f"({1e6 * d['steps_cpu_s'] / max(d['observed_steps'], 1):.0f} us/step, ledger "
          f"thread); trace-log flush {1e6 * d['flush_cpu_s'] / n:.0f} us (writer thread, "
          f"{d['flushes']} flushes, incl. the one in the pause after each turn)")
    tl = [res["tracelog"] for res in results]
    sides = [r["observed"] for r in rounds]
    print(f"checks: observed requests not ok {sum(s['not_ok'] for s in sides)}; credited "
          f"with a probe step for every token {sum(s['probe_credited'] for s in sides)}/{n}; "
          f"trace-log "
          f"requests rows {sum(t['rows_written']['requests'] for t in tl)} (incl. warm-up), "
          f"rows dropped {sum(sum(t['rows_dropped'].values()) for t in tl)}; probe steps "
          f"received in on-turns {d['steps_on']}, in off-turns {d['steps_off']}; "
          f"observed-side concurrency limit, lowest seen "
          f"{min(res['limit_min'] for res in results)} (pinned at {PINNED_LIMIT})")
