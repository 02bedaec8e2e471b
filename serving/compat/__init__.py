"""vLLM's other endpoints, answered as vLLM's OpenAI server answers them: the Responses
API (a generation route like chat), tokenize/detokenize and the probes."""
