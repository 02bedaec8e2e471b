"""Benchmarks, grouped by what they measure; each runs from the repository root as a
module, e.g. `python -m bench.serving.overhead --help`:

- `bench.serving`: what serving through tailguard costs (observation overhead, the
  step probe, output pump, OTLP export, profiling, allocator, vs vLLM's own server,
  capacity);
- `bench.tracelog`: the trace log and its queries (ingest, SLO status, the documented
  queries, archive rotation);
- `bench.policy`: SLO policies and the predictor they use (surge and breaker drill,
  prediction cost, recording training traces);
- `bench.reliability`: long runs and faults (soak, engine-crash recovery).

Helpers more than one benchmark uses live in `bench.common`.
"""
