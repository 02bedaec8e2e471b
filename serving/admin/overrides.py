"""Operator overrides: set through the admin API, kept in the trace DB's `overrides`
table (one row per change: the audit log) with a `policy_events` row (mode -> mode,
as an expiry writes one), and re-applied when a server restarts on the same file."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from slo.policy.lifecycle import AUTO, Override

LATEST_SQL = """
SELECT policy, mode, reason, actor, epoch(created_ts), epoch(expires_ts)
FROM overrides
QUALIFY row_number() OVER (PARTITION BY policy ORDER BY created_ts DESC) = 1
"""
AUDIT_SQL = """
SELECT created_ts, policy, mode, reason, actor, expires_ts FROM overrides
ORDER BY created_ts DESC LIMIT {limit}
"""


def _ts(epoch: float | None):
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=timezone.utc)


class OverrideStore:
    def __init__(self, tracelog, machines: dict):
        self.tracelog = tracelog
        self.machines = machines

    def restore(self, now: float | None = None) -> list[str]:
        """Re-apply each policy's latest override that is still in force."""
        now = time.time() if now is None else now
        restored = []
        for policy, mode, reason, actor, created, expires in self.tracelog.query(
                LATEST_SQL, max_rows=1000).rows:
            machine = self.machines.get(policy)
            if machine is None or mode == AUTO or (expires is not None and expires <= now):
                continue
            machine.override = Override(mode, reason, actor, created, expires)
            restored.append(policy)
        return restored

    def set(self, policy: str, mode: str, reason: str, actor: str,
            ttl_s: float | None = None, now: float | None = None) -> Override:
        """Validate, apply, append to the audit log and write it through."""
        if policy not in self.machines:
            raise KeyError(policy)
        if ttl_s is not None and not 0 < ttl_s <= 30 * 86400:
            raise ValueError("ttl_s must be between 0 and 30 days")
        now = time.time() if now is None else now
        override = Override(mode, reason.strip(), actor.strip() or "unknown", now,
                            now + ttl_s if ttl_s else None)
        machine = self.machines[policy]
        previous = AUTO if machine.override is None else machine.override.mode
        machine.override = None if mode == AUTO else override
        self.tracelog.add("overrides", {
            "policy": policy, "mode": mode, "reason": override.reason, "actor": override.actor,
            "created_ts": _ts(now), "expires_ts": _ts(override.expires)})
        # the policy's history reads whole without a join: mode -> mode, as an expiry does
        self.tracelog.add("policy_events", {
            "ts": _ts(now), "policy": policy, "from_state": previous, "to_state": mode,
            "reason": f"override by {override.actor}: {override.reason}",
            "details": {"actor": override.actor, "effective": machine.effective,
                        "expires_ts": override.expires}})
        self.tracelog.flush()  # an override must survive a crash right after it
        return override

    def audit(self, limit: int = 200) -> list[dict]:
        self.tracelog.flush()
        result = self.tracelog.query(AUDIT_SQL.format(limit=int(limit)), max_rows=limit)
        return [dict(zip(result.columns, row)) for row in result.rows]
