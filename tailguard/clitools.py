"""Helpers that several `tailguard` commands share."""

from __future__ import annotations


def one_line(exc: Exception) -> str:
    """`exc`'s message with every run of whitespace (newlines too) made one space, so a
    usage error stays on the one line `tailguard.cli.Group` promises."""
    return " ".join(str(exc).split())
