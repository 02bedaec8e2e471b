"""Where the server process's CPU goes: py-spy profiles and their top-N tables, CPU per
thread, and two checkouts compared (the cost gap to vLLM itself: bench/serving/vs_vllm.py)."""
