"""tailguard: observability and SLOs for LLM inference, with vLLM serving built in."""
