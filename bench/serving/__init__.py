"""What serving through tailguard costs: observation, the step probe, the output pump,
OTLP export, continuous profiling, the allocator, and tailguard against vLLM's own
server."""
