"""Admin API for the degradation policies (token-protected like all of /admin):

- `GET /admin/policies`: every policy's state, effective state, override, the live
  signals and decisions;
- `PUT /admin/policies/{name}` `{mode: auto|force_on|force_off, reason, ttl_s?, actor?}`;
- `GET /admin/audit`: override changes, newest first, and recent policy transitions;
- `GET|PUT /admin/faults`: fault injection (only with `--enable-fault-injection`).
"""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from serving.admin.auth import admin_router
from serving.admin.routes import jsonable
from serving.errors import ApiError
from slo.policy.lifecycle import MODES

EVENTS_SQL = ("SELECT ts, policy, from_state, to_state, reason, details FROM policy_events "
              "ORDER BY ts DESC LIMIT 200")


async def _body(request: Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        raise ApiError(400, "invalid_json", "body must be a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "body must be a JSON object")
    return body


def audit_actor(request: Request, declared) -> str:
    """Who the audit says made a change: the peer address as the server saw it (a
    proxy's X-Forwarded-For counts only from `--forwarded-allow-ips`), after the name
    the caller gave, if any: "alice via 10.0.0.7"."""
    peer = request.client.host if request.client else "unknown"
    name = " ".join(str(declared).split()) if declared is not None else ""
    return f"{name} via {peer}" if name else peer


def create_policy_router(runtime) -> APIRouter:
    router = admin_router(runtime)
    guard = runtime.guard

    @router.get("/policies")
    async def policies():
        signals = guard.engine.last_signals
        return JSONResponse(jsonable({
            "policies": guard.engine.describe(),
            "decisions": {**dataclasses.asdict(guard.engine.decisions),
                          "active": list(guard.engine.decisions.active)},
            "signals": dataclasses.asdict(signals) if signals else None,
            "limiter": {"limit": guard.limiter.limit, "in_flight": guard.limiter.in_flight,
                        "waiting": guard.limiter.waiting,
                        # the bounds on waiting (seed 001's hot / cold path profiles)
                        "max_wait_s": guard.limiter.max_wait_s,
                        "max_queue": guard.limiter.max_queue,
                        "prefill_gate_tokens": guard.limiter.prefill_gate,
                        "engine_prefill_tokens": guard.limiter.engine_prefill_tokens,
                        # KV-cache room kept for VIPs, and what the cache has free now
                        "vip_kv_reserve_tokens": guard.limiter.kv_reserve,
                        "kv_free_tokens": runtime.admission.kv_free_tokens(),
                        # refused requests booked to come back (slo/policy/retry_book)
                        "retry_bookings": len(runtime.admission.retries),
                        # requests kept in front so as not to make an earlier one late
                        "promise_holds": guard.limiter.promise_holds},
            # seed 000's length classes: the boundaries in force, and how often they moved
            "length_classes": {"bounds": list(runtime.admission.length_classes.bounds),
                               "moves": runtime.admission.length_classes.moves},
            # what the deadline check estimates with: the live engine model and the
            # online calibration of its estimate
            "engine_model": runtime.engine_model.describe(),
            "step_probe": runtime.ledger.describe(),
            "calibration": runtime.predictor.calibration.describe(),
            # what every request waits behind: the server's own event loop
            "event_loop_lag": runtime.loop_lag.describe(),
            "config": dataclasses.asdict(guard.engine.config)}))

    @router.put("/policies/{name}")
    async def set_policy(name: str, request: Request):
        try:
            body = await _body(request)
            mode, reason = body.get("mode"), body.get("reason")
            if mode not in MODES:
                raise ApiError(400, "invalid_mode", f"mode must be one of {', '.join(MODES)}")
            if not isinstance(reason, str) or not reason.strip():
                raise ApiError(400, "reason_required", "an override needs a non-empty reason")
            ttl = body.get("ttl_s")
            if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
                raise ApiError(400, "invalid_ttl", "ttl_s must be a number of seconds")
            actor = audit_actor(request, body.get("actor"))
            override = await asyncio.to_thread(guard.overrides.set, name, mode, reason,
                                               actor, ttl)
        except ApiError as exc:
            return exc.response()
        except KeyError:
            return ApiError(404, "unknown_policy", f"no policy {name!r}; one of: "
                            f"{', '.join(guard.engine.machines)}").response()
        except ValueError as exc:
            return ApiError(400, "invalid_override", str(exc)).response()
        guard.tick(runtime)  # the decision takes effect now, not at the next tick
        return JSONResponse({"policy": name, **dataclasses.asdict(override),
                             "effective": guard.engine.machines[name].effective})

    @router.get("/audit")
    async def audit():
        overrides = await asyncio.to_thread(guard.overrides.audit)
        events = await asyncio.to_thread(runtime.tracelog.query, EVENTS_SQL, None, 200)
        return JSONResponse(jsonable({
            "overrides": overrides,
            "events": [dict(zip(events.columns, row)) for row in events.rows]}))

    @router.get("/faults")
    async def faults():
        return JSONResponse({"enabled": runtime.faults.enabled, **runtime.faults.fault.as_dict()})

    @router.put("/faults")
    async def set_fault(request: Request):
        try:
            body = await _body(request)
            fault = runtime.faults.set(str(body.get("mode", "none")),
                                       float(body.get("delay_s", 0.0)),
                                       float(body.get("timeout_s", 60.0)))
        except ApiError as exc:
            return exc.response()
        except PermissionError as exc:
            return ApiError(403, "fault_injection_off", str(exc)).response()
        except (TypeError, ValueError) as exc:
            return ApiError(400, "invalid_fault", str(exc)).response()
        return JSONResponse({"enabled": True, **fault.as_dict()})

    return router

