"""Durations as SLO specs and the command line write them: `30d`, `6h`, `5m`, `1w`.

One small module so the server, the CLI and the spec parser agree on what `7d` means."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^(\d+)(m|h|d|w)$")
_UNIT_S = {"m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> int:
    """Seconds in `text` (`30d`, `6h`, `5m`, `1w`); ValueError for anything else or zero."""
    match = _DURATION.match(str(text).strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration like 30d, 6h or 5m")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def format_duration(seconds: int) -> str:
    """The largest whole unit: 604800 -> `1w`, 7200 -> `2h`."""
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNIT_S[unit] == 0 and seconds >= _UNIT_S[unit]:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    raise ValueError(f"{seconds}s is not a whole number of minutes")
