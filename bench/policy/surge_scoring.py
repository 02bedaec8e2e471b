"""The surge benchmark's scoring, pure functions of client results and trace-log rows
(unit-tested): each request's credit, goodput and smooth goodput, the realtime lane's
attainment with demotion as a miss, the on/off comparison and the report of a run."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from observe.registry import PRIORITY_REALTIME
from slo.targets import DEFAULT_TTFT_TARGET


def meets(r) -> bool:
    return (r.status == "ok" and r.ttft_s is not None and r.prompt_tokens is not None
            and r.ttft_s <= DEFAULT_TTFT_TARGET(r.prompt_tokens))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request's user asked for and got."""
    served: bool  # answered in full (status ok); shed, refused or failed: False
    met: bool  # first token within its context-aware TTFT target
    output_asked: int  # max_tokens sent
    output_got: int  # completion tokens received
    prompt_asked: int  # prompt tokens sent
    prompt_kept: int  # prompt tokens the engine saw (fewer when truncated)


def credit(o: Outcome) -> float:
    """0 when shed, failed or late; else the share of the asked output and prompt kept."""
    if not (o.served and o.met):
        return 0.0
    output = min(1.0, o.output_got / o.output_asked) if o.output_asked > 0 else 1.0
    prompt = min(1.0, o.prompt_kept / o.prompt_asked) if o.prompt_asked > 0 else 1.0
    return output * prompt


def goodput(outcomes: list[Outcome], duration: float) -> float:
    """Requests served on time per second; a capped or truncated request counts 1."""
    return sum(o.served and o.met for o in outcomes) / duration


def smooth_goodput(outcomes: list[Outcome], duration: float) -> float:
    """Credit per second: what the users got on time, in whole requests."""
    return sum(credit(o) for o in outcomes) / duration


def goodput_per_served(outcomes: list[Outcome]) -> float | None:
    """On-time share of the served requests: shedding the hard ones games it (shown
    for contrast; never the verdict)."""
    served = [o for o in outcomes if o.served]
    return sum(o.met for o in served) / len(served) if served else None


def outcome(r) -> Outcome:
    """A client result as an outcome; the client sees no truncation (see `truncated`)."""
    prompt = r.prompt_tokens or 0
    return Outcome(r.status == "ok", meets(r), r.max_tokens, r.output_tokens, prompt, prompt)


def demoted(row: dict) -> bool:
    return any(a.startswith("demote:") for a in row["policy_actions"] or ())


def refused_before_admission(row: dict) -> bool:
    return any(a.startswith(("shed:", "reject:")) for a in row["policy_actions"] or ())


def lane_attainment(rows: list[dict]) -> tuple[int, float | None]:
    """(requests that entered the realtime lane, share served on time and never demoted
    out of it) from trace-log rows; a demoted request is a miss of the lane."""
    lane = [r for r in rows if (r["priority"] == PRIORITY_REALTIME or demoted(r))
            and not refused_before_admission(r)]
    met = sum(r["status"] == "ok" and not demoted(r) and r["ttft_s"] is not None
              and r["slo_ttft_target_s"] is not None and r["ttft_s"] <= r["slo_ttft_target_s"]
              for r in lane)
    return len(lane), (met / len(lane) if lane else None)


def summarize(by_key: dict, duration: float) -> dict:
    """Client-side figures of one run."""
    every = [outcome(r) for rs in by_key.values() for r in rs]
    realtime = [outcome(r) for kind in ("realtime", "vip") for r in by_key[kind]]
    return {"offered": len(every), "ok": sum(o.served for o in every),
            "shed": sum(r.http_status == 503 for rs in by_key.values() for r in rs),
            "not_served": dict(Counter(r.error_type for rs in by_key.values() for r in rs
                                       if r.status != "ok")),
            "goodput_rps": goodput(every, duration),
            "smooth_goodput_rps": smooth_goodput(every, duration),
            "goodput_per_served": goodput_per_served(every),
            "realtime_key_attainment": (sum(credit(o) > 0 for o in realtime) / len(realtime)
                                        if realtime else None)}


def server_view(rows: list[dict]) -> dict:
    """Trace-log figures of one run: the realtime lane, demotions, truncations."""
    entered, attained = lane_attainment(rows)
    truncated = sum(any(a.startswith("truncate:") for a in r["policy_actions"] or ())
                    for r in rows)
    return {"realtime_lane": entered, "realtime_lane_attainment": attained,
            "demoted": sum(demoted(r) for r in rows), "truncated": truncated,
            "smooth_exact": truncated == 0}


GOAL_RATIO = 1.5  # smooth goodput on / off, median over the rounds


def compare(rows: list[dict], key: str, goal: float = GOAL_RATIO) -> dict:
    """Per-round on/off ratios of `key`, their median and spread, and the verdict: met
    when the median ratio reaches `goal` (a round with off at 0 has no ratio)."""
    by_round: dict = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["side"]] = row[key]
    ratios = [r["on"] / r["off"] for _, r in sorted(by_round.items())
              if "on" in r and "off" in r and r["off"]]
    if not ratios:
        return {"ratios": [], "median": None, "min": None, "max": None, "on_wins": 0,
                "met": False}
    median = statistics.median(ratios)
    return {"ratios": ratios, "median": median, "min": min(ratios), "max": max(ratios),
            "on_wins": sum(x > 1 for x in ratios), "met": median >= goal}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report(rows: list[dict]) -> None:
    """Every run, then the ratios with their median and spread, and the verdict."""
    print("| round | side | first? | offered | served | shed | goodput | smooth goodput "
          "| realtime-key att. | realtime lane | lane att. (demoted = miss) | demoted "
          "| truncated |")
    print("|" + "---|" * 13)
    for r in rows:
        print(f"| {r['round']} | {r['side']} | {'yes' if r['order'] == 0 else 'no'} "
              f"| {r['offered']} | {r['ok']} | {r['shed']} | {r['goodput_rps']:.2f} "
              f"| {r['smooth_goodput_rps']:.2f} | {_pct(r['realtime_key_attainment'])} "
              f"| {r['realtime_lane']} | {_pct(r['realtime_lane_attainment'])} "
              f"| {r['demoted']} | {r['truncated']} |")
    for key in ("goodput_rps", "smooth_goodput_rps"):
        c = compare(rows, key)
        spread = (f"median {c['median']:.2f} (min {c['min']:.2f}, max {c['max']:.2f})"
                  if c["ratios"] else "no ratio")
        print(f"{key} on/off per round: {[round(x, 2) for x in c['ratios']]}, {spread}, "
              f"on ahead in {c['on_wins']} of {len(c['ratios'])}")
    verdict = compare(rows, "smooth_goodput_rps")
    print(f"goal: smooth goodput on/off >= {GOAL_RATIO}x (median): "
          f"{'met' if verdict['met'] else 'NOT met'}")
    if not all(r["smooth_exact"] for r in rows):
        print("warning: the server truncated prompts; smooth goodput credits them in "
              "full (the client cannot see truncation)")
