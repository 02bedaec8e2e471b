"""SLO policies and the latency predictor they use: the surge and breaker drill, the
prediction's cost in admission, and recording traces to train it on."""
