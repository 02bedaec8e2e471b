"""Observation: the name registry, request/step stats, spans, metrics and the trace log.

Imports without vllm, torch or streamlit.
"""
