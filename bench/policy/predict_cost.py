"""Benchmark: what the latency prediction costs a request in the admission path.

Times `Admission.admit` (load snapshot + feature row + the four quantile models +
the prediction record + the predicted-miss check + the limiter), exactly what the
server runs per request before the engine when no policy holds it back,
with a model trained on a recorded trace log, and, alternating in the same run, with
the seed formula; also scikit-learn's own `predict` for the same four models, which
is why the trees are compiled to numpy.

    python -m bench.policy.predict_cost --db traces/diurnal.duckdb --calls 20000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from observe.record import RequestRecord
from serving.admission import Admission
from serving.engine.fault_injection import FaultInjector
from serving.engine.load import LoadTracker
from serving.engine.stats import EngineSecond
from serving.guard.live_predictor import PredictionService
from serving.limiter import Limiter
from slo.predict.features import TrainingSet, training_sql
from slo.predict.model import SeedModel, train


def time_admit(admission: Admission, prompts: np.ndarray) -> np.ndarray:
    async def loop():
        out = np.empty(len(prompts))
        for i, prompt in enumerate(prompts.tolist()):
            rec = RequestRecord(f"r{i}", time.monotonic(), "/v1/completions")
            began = time.perf_counter()
            await admission.admit(rec, {"prompt_token_ids": [0] * prompt}, prompt, 64)
            out[i] = time.perf_counter() - began
            admission.release(prompt, pending=True)
        return out

    return asyncio.run(loop())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    from observe.query import query_file

    data = TrainingSet.from_rows(query_file(args.db, training_sql(), max_rows=10**7,
                                            timeout_s=300).rows)
    model = train(data)
    service = PredictionService(None, None, retrain_interval_s=0)
    admission = Admission(LoadTracker(EngineSecond()), service, Limiter(64), FaultInjector(),
                          lambda tokens: 0.5)
    prompts = np.random.default_rng(0).integers(10, 4000, args.calls)
    sides = {"trained": model, "seed": SeedModel()}
    samples = {name: [] for name in sides}
    for _ in range(args.rounds):  # alternate the sides: the machine is noisy
        for name, side in sides.items():
            service.model = side
            samples[name].append(time_admit(admission, prompts))
    for name, runs in samples.items():
        all_runs = np.concatenate(runs)
        p50s = [np.percentile(r, 50) * 1e6 for r in runs]
        print(f"{name:8} admit p50 {np.percentile(all_runs, 50) * 1e6:6.1f} µs  "
              f"p99 {np.percentile(all_runs, 99) * 1e6:6.1f} µs  max {all_runs.max() * 1e6:7.1f} µs"
              f"  (per-round p50 {min(p50s):.1f}-{max(p50s):.1f})")
    print(f"sklearn predict, 4 models, one row: p50 {_sklearn_cost(data) * 1e6:.0f} µs")


def _sklearn_cost(data: TrainingSet) -> float:
    from sklearn.ensemble import HistGradientBoostingRegressor

    y = np.log(data.ttft_s)
    models = [HistGradientBoostingRegressor(loss="quantile", quantile=q, max_iter=200,
                                            max_depth=8).fit(data.X, y) for q in (.5, .9, .5, .9)]
    row = data.X[:1]
    times = []
    for _ in range(200):
        began = time.perf_counter()
        for m in models:
            m.predict(row)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


if __name__ == "__main__":
    main()
