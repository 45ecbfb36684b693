"""A planned stop behind a gateway: out of rotation first, then the server's own requests finish, then the stop.

The gateway does not wait for a removed worker's requests (SMG drops it after 5 s, the router at once), so the
server itself is asked: its requests in flight at the HTTP layer (`sglang:http_requests_active` on the
generation endpoints, live), else its running and queued gauges. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING

import aiohttp

from policies.membership import may_stop
from policies.pd import Role
from probes.progress import GENERATION_ENDPOINTS, scrape_metrics

if TYPE_CHECKING:
    from supervisor.gateway.membership import Membership
    from supervisor.loop.commands import Command
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
    """Before a planned restart: out of the gateway only while `min_available` other ready workers of the model
    stay in it — checked in this worker's turn (restarts asked of several daemons at once go one after another),
    before leaving and again after (a peer daemon may still have left at the same moment: then back in, and tried
    again after a random pause). Bounded by `[gateway] wait_available_s`; (go ahead, why)."""
    gateway, cfg = loop.svc.gateway, loop.svc.config.gateway
    if gateway is None or cfg is None or cfg.min_available == 0 or loop.cfg.role is Role.ROUTER:
        return True, ""
    wants = gateway.wants()
    own = [w.url for w in wants]
    model = loop.cfg.arg("--served-model-name") or loop.cfg.model_path or ""
    deadline = time.monotonic() + cfg.wait_available_s
    mine = next((w.url for w in wants if w.server == loop.name), "")
    if mine:
        await asyncio.sleep(min(await gateway.turn_s(model, mine), max(0.0, deadline - time.monotonic())))
    while True:
        ok, why = await _count(gateway, model, own, cfg.min_available)
        if ok:
            await gateway.leave(loop.name, cfg.timeout_s * 3)
            ok, why = await _count(gateway, model, own, cfg.min_available)
            if ok:
                return True, why
            gateway.rejoin(loop.name)
        if time.monotonic() >= deadline:
            return False, why
        await asyncio.sleep(min(random.uniform(1.0, 3.0), max(0.1, deadline - time.monotonic())))


class RestartGate:
    """A planned restart behind a gateway with `min_available`: `wait_for_others` runs as a task while the watch
    goes on (a fault decided meanwhile wins and refuses the restart); one restart waits at a time."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.task: asyncio.Task[tuple[bool, str]] | None = None
        self.cmd: Command | None = None

    def needed(self) -> bool:
        """Whether a restart of this server must wait for the gateway's other workers."""
        cfg = self.loop.svc.config.gateway
        return cfg is not None and cfg.min_available > 0 and self.loop.cfg.role is not Role.ROUTER

    def start(self, cmd: Command) -> None:
        """Begin waiting for `cmd`'s turn (a second restart meanwhile is refused)."""
        if self.task is not None:
            cmd.answer("refused: a restart of this server already waits for min_available")
            return
        self.cmd, self.task = cmd, asyncio.ensure_future(wait_for_others(self.loop))

    def ready(self) -> Command | None:
        """The restart whose turn has come (the server out of the gateway), else None; a wait that ran out is
        refused with the count."""
        if self.task is None or not self.task.done() or self.cmd is None:
            return None
        cmd, task = self.cmd, self.task
        self.cmd = self.task = None
        ok, why = task.result() if not task.cancelled() else (False, "cancelled")
        if ok:
            return cmd
        self.loop.log.warning("gateway.restart_refused", reason=why, actor=cmd.actor)
        cmd.answer(f"refused: {why}")
        return None

    def cancel(self, why: str) -> None:
        """The watch ends another way (a fault, a stop): the waiting restart is refused, the server rejoins."""
        if self.task is None or self.cmd is None:
            return
        self.task.cancel()
        if self.loop.svc.gateway is not None:
            self.loop.svc.gateway.rejoin(self.loop.name)
        self.loop.log.warning("gateway.restart_refused", reason=why, actor=self.cmd.actor)
        self.cmd.answer(f"refused: {why}")
        self.cmd = self.task = None


async def _count(gateway: Membership, model: str, own: list[str], min_available: int) -> tuple[bool, str]:
    available = await gateway.available_besides(model, own)
    ok, why = may_stop(available if available is not None else 0, min_available)
    if available is None:
        why = f"the gateway did not answer ({gateway.last_error}); " + why
    return ok and available is not None, why
