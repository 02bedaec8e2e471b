"""Prometheus recording and alert rules generated from the SLO specs."""

from alerts.config import RuleConfig
from alerts.rules import render_rules, render_tests, rule_groups, write

__all__ = ["RuleConfig", "render_rules", "render_tests", "rule_groups", "write"]
