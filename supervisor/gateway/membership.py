"""The membership task: keeps this daemon's servers in SGLang's gateway exactly while they are proven.

It runs beside the server loops, never inside a recovery: a state change pokes it and it reconciles at once
(`GET /workers`, then the adds and removes `policies.membership.calls` chooses), otherwise every
`PERIOD_S`. A failed round (gateway down, a 401, a 5xx) is retried with backoff up to `policies.membership`'s
cap and converges once the gateway answers again — a restarted gateway with an empty list is refilled with the
ready servers. A kill or a relaunch never waits for it; a planned stop waits for it (bounded) before it drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import structlog

from policies.membership import Listed, Want, backoff_s, calls, member_id, others_available, turn_s
from supervisor.gateway.client import GatewayClient, GatewayError
from supervisor.reporting.metrics import SupervisorMetrics

PERIOD_S = 10.0
PENDING_S = 1.0  # an add the gateway refused for now (SMG: 409 while the URL still drains): tried again soon
ADD_SETTLE_S = (
    10.0  # SMG hides a worker from GET /workers while it registers it (~2 s): no second add meanwhile
)
log = structlog.get_logger("supervisor.gateway")


@dataclass
class Member:
    """One server's membership as last seen: its worker id, since when (wall time), the last error."""

    id: str = ""
    since: float | None = None
    last_error: str = ""
    out_of_sync_since: float | None = None  # monotonic


class Membership:
    """Applies `wants()` to the gateway; status and metrics read what it last saw."""

    def __init__(
        self, client: GatewayClient, wants: Callable[[], list[Want]], metrics: SupervisorMetrics
    ) -> None:
        self.client, self.wants, self.metrics = client, wants, metrics
        self.members: dict[str, Member] = {}
        self.listed: list[Listed] = []
        self.failures = 0
        self.last_error = ""
        self.reached_at: float | None = None  # wall time of the last answer
        self.pending = False  # an add was refused for now (a 409 while draining): the next round comes soon
        self.held: set[str] = set()  # servers kept out ahead of a planned stop, whatever their state
        self.added_at: dict[str, float] = {}  # URL -> when it was last added (monotonic)
        self._poke = asyncio.Event()
        self._round_done = asyncio.Event()

    def poke(self) -> None:
        """Something changed: reconcile now."""
        self._poke.set()

    async def run(self) -> None:
        """Reconcile until cancelled."""
        while True:
            await self.round()
            delay = backoff_s(self.failures) if self.failures else PENDING_S if self.pending else PERIOD_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), delay)

    async def round(self) -> None:
        """One reconciliation: list, then add and remove what differs; errors are kept, never raised."""
        self._poke.clear()
        wants = self.current_wants()
        errors: list[GatewayError] = []
        try:
            self.listed = await self._listed()
            todo = sorted(calls(wants, self.listed), key=lambda c: c.op != "remove")  # removals first
            settling = [c for c in todo if c.op == "add" and self._settling(c.url)]
            todo = [c for c in todo if c not in settling]
            self.pending = bool(settling)
            for call in todo:  # each on its own: one refused call does not hold up the others
                try:
                    await self._apply(
                        call.op, call.server, call.url, call.id, call.worker_type, call.bootstrap_port
                    )
                except GatewayError as exc:
                    errors.append(exc)
            if todo:
                self.listed = await self._listed()
        except GatewayError as exc:
            errors.append(exc)
        if errors:
            self.failures += 1
            self.last_error = f"{errors[0].kind}: {errors[0]}"
            log.warning("gateway.unavailable", error=self.last_error, retry_in_s=backoff_s(self.failures))
        else:
            self.failures, self.last_error = 0, ""
        self._observe(wants)
        self._round_done.set()
        self._round_done = asyncio.Event()

    def _settling(self, url: str) -> bool:
        """Added moments ago and not listed yet: the gateway is still registering it (SMG hides it meanwhile)."""
        at = self.added_at.get(url)
        return at is not None and time.monotonic() - at < ADD_SETTLE_S

    async def _listed(self) -> list[Listed]:
        try:
            listed = await self.client.workers()
        except GatewayError:
            self.metrics.gateway_call("list", "error")
            raise
        self.metrics.gateway_call("list", "ok")
        self.reached_at = time.time()
        return listed

    async def _apply(
        self, op: str, server: str, url: str, worker_id: str, worker_type: str, bootstrap: int | None
    ) -> None:
        member = self.members.setdefault(server, Member())
        try:
            if op == "add":
                member.id = await self.client.add(url, worker_type, bootstrap)
                if not member.id:  # the gateway has that URL still (SMG: draining for 5 s after a removal)
                    self.pending = True
                    return
                self.added_at[url] = time.monotonic()
            else:
                await self.client.remove(worker_id)
                self.added_at.pop(url, None)
        except GatewayError as exc:
            self.metrics.gateway_call(op, "error")
            member.last_error = f"{op}: {exc}"
            raise
        self.metrics.gateway_call(op, "ok")
        member.since, member.last_error = time.time(), ""
        if op == "add":
            log.info("gateway.added", server=server, url=url, worker_id=member.id)
        else:
            log.info("gateway.removed", server=server, url=url, worker_id=worker_id)

    def _observe(self, wants: list[Want]) -> None:
        now = time.monotonic()
        for want in wants:
            member = self.members.setdefault(want.server, Member())
            worker = member_id(want.url, self.listed) if not self.failures else member.id
            member.id = worker
            listed = bool(worker)
            # a gateway that cannot be reached holds nothing this daemon can vouch for: out of sync meanwhile
            synced = want.member is None or (not self.failures and listed == want.member)
            if synced:
                member.out_of_sync_since = None
            elif member.out_of_sync_since is None:
                member.out_of_sync_since = now
            lag = now - member.out_of_sync_since if member.out_of_sync_since is not None else 0.0
            self.metrics.gateway_state(want.server, listed, lag)

    def current_wants(self) -> list[Want]:
        """What each server wants, with the servers held out for a planned stop out."""
        return [replace(w, member=False) if w.server in self.held else w for w in self.wants()]

    def rejoin(self, server: str) -> None:
        """End a hold: the server's state decides its membership again."""
        self.held.discard(server)
        self.poke()

    async def leave(self, server: str, timeout_s: float) -> bool:
        """Hold `server` out, poke, and wait (at most `timeout_s`) until the gateway no longer lists it."""
        self.held.add(server)
        url = next((w.url for w in self.wants() if w.server == server), "")
        deadline = time.monotonic() + timeout_s
        while True:
            done = self._round_done
            self.poke()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), max(0.0, deadline - time.monotonic()))
            if not self.failures and not member_id(url, self.listed):
                return True
            if time.monotonic() >= deadline:
                return False

    async def available_besides(self, model: str, own: list[str]) -> int | None:
        """Ready workers of `model` in the gateway that are not `own` URLs (None: the gateway did not answer)."""
        try:
            listed = await self._listed()
        except GatewayError:
            return None
        return others_available(model, own, listed)

    async def turn_s(self, model: str, url: str) -> float:
        """The wait before a planned restart's first `min_available` check (policies.membership.turn_s); 0 when
        the gateway does not answer (the check that follows says so)."""
        try:
            listed = await self._listed()
        except GatewayError:
            return 0.0
        return turn_s(url, model, listed)

    def view(self, server: str) -> dict[str, Any]:
        """This server's membership for `/status` (no key, no secret)."""
        member = self.members.get(server, Member())
        return {
            "worker_id": member.id or None,
            "member": bool(member.id),
            "since": member.since,
            "last_error": member.last_error or self.last_error or None,
        }

    def summary(self) -> dict[str, Any]:
        """The gateway as this daemon sees it, for `/status`."""
        return {
            "url": self.client.url,
            "reachable": not self.failures and self.reached_at is not None,
            "last_answer_at": self.reached_at,
            "last_error": self.last_error or None,
        }
