"""SLO specs, context-aware targets and per-request verdicts."""
