"""Replay / what-if: re-run the policy engine over a recorded trace log in simulated
time, on an engine model calibrated from the same log, and compare attainment,
goodput and shed rate with what really happened or with other policies.

`validate` replays a run against its own outcome (the simulator's error); `compare`
runs a baseline and a candidate policy config on the same arrivals; `scale` splits
k times today's arrivals round-robin over R replicas (each replica then sees every
R-th request of the k-fold stream: one simulated replica stands for all of them).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import numpy as np

from observe import registry as R
from slo.policy import conditions as P
from slo.policy.retry_book import RETRY_BOOKED
from slo.sim.engine_model import EngineModel, Query
from slo.sim.request import SimRequest
from slo.sim.simulation import Simulator
from slo.tenants import SHED_SQL

# Requests the policies could have acted on: everything that reached admission.
# Client mistakes (400/401/404/413/422) are the same whatever the policy. Logs written
# before the `vip` column existed replay everyone as non-VIP; the prediction the server
# made at admission (when recorded) is what its predicted-miss policy judged.
ARRIVALS_SQL = """SELECT epoch(arrival_ts) AS t, prompt_tokens, output_tokens, max_tokens,
  priority, {vip} AS vip, {predicted} AS predicted_ttft_s, slo_ttft_target_s, status, ttft_s,
  {shed} AS shed, list_contains(policy_actions, '{booked}') AS booked
FROM requests
WHERE status <> 'rejected' OR http_status IN (429, 503)
ORDER BY arrival_ts"""
COLUMNS_SQL = "SELECT column_name FROM information_schema.columns WHERE table_name = 'requests'"


@dataclass(frozen=True, slots=True)
class Outcome:
    requests: int
    attainment: float  # share of requests answered within their TTFT target
    goodput_rps: float  # such requests per second of the trace
    shed_rate: float  # share refused by a policy (or the limiter's timeout)
    ttft_p50_s: float
    ttft_p99_s: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Recorded:
    """The arrivals of a trace log and what happened to them."""
    requests: list[dict]
    duration_s: float

    def arrivals(self) -> list[SimRequest]:
        prompt, output = _typical(self.requests)
        return [SimRequest(arrival=r["t"], prompt=r["prompt_tokens"] or prompt,
                           output=r["output_tokens"] if not r["shed"] else output(r),
                           max_tokens=r["max_tokens"], priority=r["priority"] or
                           R.PRIORITY_REALTIME, vip=bool(r["vip"]),
                           target_s=r["slo_ttft_target_s"],
                           predicted_ttft_s=r["predicted_ttft_s"], booked=bool(r.get("booked")))
                for r in self.requests]

    def actual(self) -> Outcome:
        good = [r["status"] == R.STATUS_OK and r["ttft_s"] is not None
                and (r["slo_ttft_target_s"] is None or r["ttft_s"] <= r["slo_ttft_target_s"])
                for r in self.requests]
        ttft = [r["ttft_s"] for r in self.requests if r["ttft_s"] is not None]
        return _outcome(len(self.requests), sum(good), sum(r["shed"] for r in self.requests),
                        ttft, self.duration_s)


def load_recorded(query: Query) -> Recorded:
    present = {name for (name,) in query(COLUMNS_SQL)[1]}
    columns, rows = query(ARRIVALS_SQL.format(
        vip="coalesce(vip, false)" if "vip" in present else "false",
        predicted="predicted_ttft_s" if "predicted_ttft_s" in present else "NULL",
        shed=SHED_SQL, booked=RETRY_BOOKED))
    if not rows:
        raise ValueError("the trace log holds no requests to replay")
    start = rows[0][0]
    requests = [dict(zip(columns, row)) | {"t": row[0] - start} for row in rows]
    return Recorded(requests, max(1.0, requests[-1]["t"]))


def _typical(requests: list[dict]):
    """For requests shed before the server read them (no prompt length) or before
    they generated: the median prompt, and the median output within max_tokens, of
    the requests served."""
    served = [r for r in requests if not r["shed"] and r["output_tokens"]]
    prompt = int(np.median([r["prompt_tokens"] for r in served])) if served else 256
    output = int(np.median([r["output_tokens"] for r in served])) if served else 16
    return prompt, lambda r: max(1, min(output, r["max_tokens"] or output))


def _outcome(n: int, good: int, shed: int, ttft: list[float], duration_s: float) -> Outcome:
    p50, p99 = (np.quantile(ttft, [0.5, 0.99]) if ttft else (float("nan"),) * 2)
    return Outcome(n, good / n if n else float("nan"), good / duration_s,
                   shed / n if n else float("nan"), float(p50), float(p99))


def simulate(model: EngineModel, config: P.PolicyConfig | None, arrivals: list[SimRequest],
             duration_s: float) -> tuple[Outcome, Simulator]:
    sim = Simulator(model, config)
    done = sim.run(arrivals)
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    shed = sum(1 for r in done if r.shed)
    return _outcome(len(done), sum(r.good for r in done), shed, ttft, duration_s), sim


def validate(model: EngineModel, config: P.PolicyConfig, recorded: Recorded) -> dict:
    """Replay a run with the config it ran under; the error is simulated - actual."""
    simulated, _ = simulate(model, config, recorded.arrivals(), recorded.duration_s)
    actual = recorded.actual()
    error = {k: getattr(simulated, k) - getattr(actual, k)
             for k in ("attainment", "goodput_rps", "shed_rate", "ttft_p50_s", "ttft_p99_s")}
    return {"actual": actual.as_dict(), "simulated": simulated.as_dict(), "error": error}


def compare(model: EngineModel, baseline: P.PolicyConfig, candidate: P.PolicyConfig,
            recorded: Recorded) -> dict:
    base, _ = simulate(model, baseline, recorded.arrivals(), recorded.duration_s)
    cand, sim = simulate(model, candidate, recorded.arrivals(), recorded.duration_s)
    return {"actual": recorded.actual().as_dict(), "baseline": base.as_dict(),
            "candidate": cand.as_dict(), "candidate_transitions": len(sim.transitions)}


def scaled_arrivals(recorded: Recorded, load: float, replicas: int,
                    seed: int = 0) -> list[SimRequest]:
    """Every `replicas`-th request of `load` times today's arrivals (each recorded
    request copied with arrival jitter within a second; a fractional load keeps a
    random share of the copies)."""
    rng = random.Random(seed)
    stream = []
    for r in recorded.arrivals():
        copies = int(load) + (rng.random() < load - int(load))
        stream.extend(SimRequest(**{**_fields(r), "arrival": r.arrival + rng.random()})
                      for _ in range(copies))
    stream.sort(key=lambda r: r.arrival)
    return stream[rng.randrange(replicas)::replicas] if replicas > 1 else stream


def _fields(r: SimRequest) -> dict:
    return {k: getattr(r, k) for k in ("arrival", "prompt", "output", "max_tokens",
                                       "priority", "vip", "target_s", "predicted_ttft_s")}


def scale(model: EngineModel, config: P.PolicyConfig | None, recorded: Recorded,
          load: float, replicas: list[int]) -> list[dict]:
    """Attainment, goodput (of the whole fleet) and shed rate per replica count."""
    rows = []
    for n in replicas:
        outcome, _ = simulate(model, config, scaled_arrivals(recorded, load, n),
                              recorded.duration_s)
        rows.append({"load": load, "replicas": n, **outcome.as_dict(),
                     "fleet_goodput_rps": outcome.goodput_rps * n})
    return rows
