"""Dashboards: the Streamlit ops console and generated Grafana JSON."""
