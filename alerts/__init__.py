"""Prometheus recording and alert rules generated from the SLO specs."""
