"""The surge benchmark's scoring, pure functions of client results and trace-log rows
(unit-tested): each request's credit, goodput and smooth goodput, the realtime lane's
attainment with demotion as a miss, the on/off comparison and the report of a run."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from observe.registry import PRIORITY_REALTIME
from slo.policy.feasibility import DEFAULT_MARGIN
from slo.targets import DEFAULT_TTFT_TARGET

UNATTAINABLE = "unattainable"  # the error code of a deferred best-effort request


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
    return any(a.startswith(("shed:", "reject:", "refuse:"))
               for a in row["policy_actions"] or ())


def on_time(row: dict) -> bool:
    return (row["status"] == "ok" and row["ttft_s"] is not None
            and row["slo_ttft_target_s"] is not None
            and row["ttft_s"] <= row["slo_ttft_target_s"])


def best_effort(row: dict) -> bool:
    """The deadline check found it late even on an idle engine (its target under what
    this engine can do for its length) and served it in the batch lane at once: never
    admitted as a request to serve on time."""
    return "demote:unattainable" in (row["policy_actions"] or ())


def admitted_attainment(rows: list[dict]) -> dict:
    """Of the requests admitted (not refused before admission): the share of realtime
    (non-VIP) ones on time and never demoted, and of VIP ones on time; VIP requests
    refused count as misses of VIP, which is never refused for load. A realtime
    request served best effort is counted apart (`best_effort`), not as admitted: the
    server said at once it could not be on time (one demoted while it waited is a
    miss)."""
    realtime = [r for r in rows if (r["priority"] == PRIORITY_REALTIME or demoted(r))
                and not r["vip"] and not refused_before_admission(r)]
    admitted = [r for r in realtime if not best_effort(r)]
    vip = [r for r in rows if r["vip"]]
    return {"admitted_realtime": len(admitted),
            "admitted_realtime_attainment": _share(
                [on_time(r) and not demoted(r) for r in admitted]),
            "best_effort": len(realtime) - len(admitted),
            "vip": len(vip), "vip_attainment": _share([on_time(r) for r in vip])}


def miss_prediction(rows: list[dict], margin: float = DEFAULT_MARGIN) -> dict:
    """How the deadline check's verdicts (estimate > margin x target: refuse) compare
    with what happened, on a run where it refused nobody (the policy off): precision
    (of the predicted misses, the share that missed) and recall (of the misses, the
    share predicted)."""
    judged = [r for r in rows if r["status"] == "ok" and r["estimated_ttft_s"] is not None
              and r["slo_ttft_target_s"] is not None and r["ttft_s"] is not None]
    predicted = [r["estimated_ttft_s"] > margin * r["slo_ttft_target_s"] for r in judged]
    missed = [not on_time(r) for r in judged]
    hits = sum(p and m for p, m in zip(predicted, missed))
    return {"judged": len(judged), "predicted_misses": sum(predicted), "misses": sum(missed),
            "precision": hits / sum(predicted) if any(predicted) else None,
            "recall": hits / sum(missed) if any(missed) else None}


def prediction_accuracy(rows: list[dict]) -> dict:
    """The TTFT prediction made at admission against what each served request had:
    median absolute percentage error of the p50 and the share within the p90."""
    judged = [r for r in rows if r["status"] == "ok" and r["ttft_s"]
              and r["predicted_ttft_s"] is not None]
    errors = sorted(abs(r["predicted_ttft_s"] - r["ttft_s"]) / r["ttft_s"] for r in judged)
    return {"predicted": len(judged),
            "ttft_mape_p50": statistics.median(errors) if errors else None,
            "ttft_p90_coverage": _share([r["ttft_s"] <= r["predicted_ttft_p90_s"]
                                         for r in judged])}


def retries(by_key: dict) -> dict:
    """Requests refused with 429 that came back after their Retry-After: how many; the
    share then served on time of those refused as late for the queue (`deadline`:
    their Retry-After said when they could be on time); how many of the retries were
    deferred (`unattainable`: late even on an idle engine, told when they would be
    served best effort, never on time)."""
    back = [r for rs in by_key.values() for r in rs if r.retry is not None]
    timely = [r.retry for r in back if r.error_type != UNATTAINABLE]
    return {"retried": len(back), "retry_on_time": _share([meets(r) for r in timely]),
            "deferred_retried": len(back) - len(timely)}


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


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
            "shed": sum(r.http_status == 503 or r.error_type in ("deadline", UNATTAINABLE)
                        for rs in by_key.values() for r in rs),
            "not_served": dict(Counter(r.error_type for rs in by_key.values() for r in rs
                                       if r.status != "ok")),
            "goodput_rps": goodput(every, duration),
            "smooth_goodput_rps": smooth_goodput(every, duration),
            "goodput_per_served": goodput_per_served(every),
            "realtime_key_attainment": (sum(credit(o) > 0 for o in realtime) / len(realtime)
                                        if realtime else None),
            **retries(by_key)}


def server_view(rows: list[dict], margin: float = DEFAULT_MARGIN) -> dict:
    """Trace-log figures of one run: the realtime lane, demotions, truncations;
    `margin`: the server's `deadline_margin`, for the would-refuse verdicts."""
    entered, attained = lane_attainment(rows)
    truncated = sum(any(a.startswith("truncate:") for a in r["policy_actions"] or ())
                    for r in rows)
    return {"realtime_lane": entered, "realtime_lane_attainment": attained,
            "demoted": sum(demoted(r) for r in rows), "truncated": truncated,
            "smooth_exact": truncated == 0, **admitted_attainment(rows),
            **{f"miss_{k}": v for k, v in miss_prediction(rows, margin).items()},
            **prediction_accuracy(rows)}


GOAL_RATIO = 1.5  # smooth goodput on / off, in every round (issue 19: 1.2 at 3x)


def compare(rows: list[dict], key: str, goal: float = GOAL_RATIO) -> dict:
    """Per-round on/off ratios of `key`, their median and spread, and the verdict: met
    when every round's ratio reaches `goal` (a round with off at 0 and on above it
    counts as infinitely ahead)."""
    by_round: dict = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["side"]] = row[key]
    ratios = [r["on"] / r["off"] if r["off"] else (float("inf") if r["on"] else 1.0)
              for _, r in sorted(by_round.items()) if "on" in r and "off" in r]
    if not ratios:
        return {"ratios": [], "median": None, "min": None, "max": None, "on_wins": 0,
                "met": False}
    median = statistics.median(ratios)
    return {"ratios": ratios, "median": median, "min": min(ratios), "max": max(ratios),
            "on_wins": sum(x > 1 for x in ratios), "met": min(ratios) >= goal}


def _deferred(r: dict) -> str:
    return f" ({r['deferred_retried']} deferred)" if r.get("deferred_retried") else ""


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report(rows: list[dict], goal: float = GOAL_RATIO) -> bool:
    """Every run, then the ratios with their median and spread, and the verdict (True:
    met)."""
    print("| round | side | first? | base busy | offered | served | refused | goodput "
          "| smooth goodput "
          "| realtime-key att. | admitted realtime att. | best effort | VIP att. | demoted "
          "| retried | retry on time | miss precision / recall "
          "| TTFT MAPE p50 / p90 coverage |")
    print("|" + "---|" * 18)
    for r in rows:
        pr = (f"{_pct(r['miss_precision'])} / {_pct(r['miss_recall'])}"
              if r["side"] == "off" else "-")
        print(f"| {r['round']} | {r['side']} | {'yes' if r['order'] == 0 else 'no'} "
              f"| {_pct(r.get('base_busy'))} | {r['offered']} | {r['ok']} | {r['shed']} "
              f"| {r['goodput_rps']:.2f} "
              f"| {r['smooth_goodput_rps']:.2f} | {_pct(r['realtime_key_attainment'])} "
              f"| {_pct(r['admitted_realtime_attainment'])} ({r['admitted_realtime']}) "
              f"| {r.get('best_effort', 0)} "
              f"| {_pct(r['vip_attainment'])} ({r['vip']}) | {r['demoted']} "
              f"| {r['retried']}{_deferred(r)} | {_pct(r['retry_on_time'])} | {pr} "
              f"| {_pct(r['ttft_mape_p50'])} / {_pct(r['ttft_p90_coverage'])} |")
    for key in ("goodput_rps", "smooth_goodput_rps"):
        c = compare(rows, key, goal)
        spread = (f"median {c['median']:.2f} (min {c['min']:.2f}, max {c['max']:.2f})"
                  if c["ratios"] else "no ratio")
        print(f"{key} on/off per round: {[round(x, 2) for x in c['ratios']]}, {spread}, "
              f"on ahead in {c['on_wins']} of {len(c['ratios'])}")
    verdict = compare(rows, "goodput_rps", goal)
    print(f"goal: goodput on/off >= {goal}x in every round: "
          f"{'met' if verdict['met'] else 'NOT met'}")
    if not all(r["smooth_exact"] for r in rows):
        print("warning: the server truncated prompts; smooth goodput credits them in "
              "full (the client cannot see truncation)")
    return verdict["met"]
