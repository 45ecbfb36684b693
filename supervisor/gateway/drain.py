"""A planned stop behind a gateway: out of rotation first, then the server's own requests finish, then the stop.

The gateway does not wait for a removed worker's requests (SMG drops it after 5 s, the router at once), so the
server itself is asked: its requests in flight at the HTTP layer (`sglang:http_requests_active` on the
generation endpoints, live), else its running and queued gauges. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp

from policies.membership import may_stop
from policies.pd import Role
from probes.progress import GENERATION_ENDPOINTS, scrape_metrics

if TYPE_CHECKING:
    from supervisor.loop.context import Loop

POLL_S = 0.5
MAX_METRICS_BYTES = 4 * 1024 * 1024


async def in_flight(base_url: str, api_key: str | None, timeout_s: float) -> float | None:
    """Requests the server is still serving (None: its metrics did not answer)."""
    async with aiohttp.ClientSession() as session:
        samples, _, _ = await scrape_metrics(session, base_url, timeout_s, MAX_METRICS_BYTES, api_key)
    if samples is None:
        return None
    active = [s for s in samples if s.name == "sglang:http_requests_active"]
    if active:
        return sum(s.value for s in active if s.labels.get("endpoint") in GENERATION_ENDPOINTS)
    return sum(s.value for s in samples if s.name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"))


async def leave_for_planned_stop(loop: Loop, api_key: str | None) -> str:
    """Out of the gateway, then wait (bounded by `[gateway] drain_s`) until the server serves no request.
    Returns what happened, one line for the log; never raises."""
    gateway, cfg = loop.svc.gateway, loop.svc.config.gateway
    if gateway is None or cfg is None or loop.cfg.role is Role.ROUTER:
        return ""
    loop.busy(cfg.timeout_s * 3 + cfg.drain_s + 30.0)
    left = await gateway.leave(loop.name, cfg.timeout_s * 3)
    deadline = time.monotonic() + cfg.drain_s
    remaining = await in_flight(loop.cfg.base_url, api_key, cfg.timeout_s)
    while remaining and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
        remaining = await in_flight(loop.cfg.base_url, api_key, cfg.timeout_s)
    loop.busy(0)
    loop.beat()
    out = "out of the gateway" if left else f"the gateway did not confirm the removal ({gateway.last_error})"
    return f"{out}; {remaining or 0:g} request(s) still in flight" if remaining else f"{out}; idle"


async def wait_for_others(loop: Loop) -> tuple[bool, str]:
    """Before a planned stop: wait (bounded by `[gateway] wait_available_s`) while the gateway would be left with
    fewer than `min_available` other ready workers of the model; (go ahead, why)."""
    gateway, cfg = loop.svc.gateway, loop.svc.config.gateway
    if gateway is None or cfg is None or cfg.min_available == 0 or loop.cfg.role is Role.ROUTER:
        return True, ""
    own = [w.url for w in gateway.wants()]
    model = loop.cfg.arg("--served-model-name") or loop.cfg.model_path or ""
    deadline = time.monotonic() + cfg.wait_available_s
    while True:
        loop.beat()
        available = await gateway.available_besides(model, own)
        ok, why = may_stop(available if available is not None else 0, cfg.min_available)
        if available is None:
            why = f"the gateway did not answer ({gateway.last_error}); " + why
        if ok or time.monotonic() >= deadline:
            return ok, why
        await asyncio.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
