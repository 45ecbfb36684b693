"""What a PD worker's loop reads of the other servers of its deployment: the pair its canary goes through, the
partner it waits for, a decode's prefills (policies.pd judges them).

A partner is up when its newest `/health` answered 200 in a launch that is starting or serving: a prefill and
its decode start together, and each proves the pair as soon as the other answers.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from policies.model import Observation
from policies.pd import Role, heartbeat_window_s, relaunch_hold_s, restart_order
from policies.states import ServerState
from probes.pd_pair import PdPair
from supervisor.loop.commands import Command
from supervisor.loop.services import Peer, Services

if TYPE_CHECKING:
    from supervisor.loop.context import Loop

S = ServerState
PARTNER = {Role.PREFILL: Role.DECODE, Role.DECODE: Role.PREFILL}
LIVE = (S.STARTING, S.SERVING, S.DEGRADED)


def is_worker(role: Role) -> bool:
    """A prefill or a decode: its canaries go through a pair."""
    return role in PARTNER


def _up(peer: Peer) -> bool:
    """The peer's current launch answered its newest `/health` with 200 (a reading of an earlier launch, kept
    while the next one starts, does not count)."""
    health, owner = peer.latest_health(), peer.owner
    if owner.state not in LIVE or owner.run is None or health is None:
        return False
    return health.ok and health.at >= owner.started_at


def pair(svc: Services, name: str) -> PdPair | None:
    """The pair `name`'s canary goes through: itself and the first partner up (None while none is, or for a
    server that is not a PD worker)."""
    me = svc.loops.get(name)
    if me is None or me.cfg.role not in PARTNER:
        return None
    partner = next((p for p in svc.loops.values() if p.cfg.role is PARTNER[me.cfg.role] and _up(p)), None)
    if partner is None:
        return None
    prefill, decode = (me, partner) if me.cfg.role is Role.PREFILL else (partner, me)
    host = urlparse(prefill.cfg.base_url).hostname or "127.0.0.1"
    return PdPair(prefill.cfg.base_url, decode.cfg.base_url, host, prefill.cfg.bootstrap_port or 8998)


def awaiting(svc: Services, name: str) -> str:
    """What a PD worker or router waits for to prove itself: "a decode" for a prefill with no decode up; for a
    router, each kind of worker of its config none of which is up ("a prefill and a decode", "a unified server");
    '' when nothing."""
    me = svc.loops.get(name)
    if me is None:
        return ""
    if me.cfg.role is Role.ROUTER:
        peers = list(svc.loops.values())
        missing = [
            role
            for role in (Role.PREFILL, Role.DECODE, Role.UNIFIED)
            if any(p.cfg.role is role for p in peers)
            and not any(p.cfg.role is role and _up(p) for p in peers)
        ]
        return " and ".join("a unified server" if r is Role.UNIFIED else f"a {r.value}" for r in missing)
    if me.cfg.role not in PARTNER or pair(svc, name) is not None:
        return ""
    return f"a {PARTNER[me.cfg.role].value}"


def prefills(svc: Services, name: str, now: float) -> tuple[Observation | None, ...]:
    """A decode: each prefill's newest progress observation; None for one not serving, or serving for less than
    the decode's stall window (requests the decode parked before it came back are bound to the prefill before it:
    SGLang fails them by itself once its heartbeat drops that one). Others: none."""
    me = svc.loops.get(name)
    if me is None or me.cfg.role is not Role.DECODE:
        return ()
    window = me.cfg.probes.stall_after_s
    out: list[Observation | None] = []
    for peer in svc.loops.values():
        if peer.cfg.role is Role.PREFILL:
            since = peer.owner.serving_since
            settled = since is not None and now - since >= window
            out.append(peer.latest_progress() if settled else None)
    return tuple(out)


def restart_followers(svc: Services, prefill: str, why: str, log: Any) -> None:
    """A relaunched prefill whose pair canary failed with a decode up: that decode kept the old prefill's
    endpoints (SGLang drops them only after two missed heartbeats), so it follows. A pair that proves itself
    keeps its decode, as the real pair does (real-pd.md)."""
    roles = {name: peer.cfg.role for name, peer in svc.loops.items()}
    for name in restart_order(prefill, roles)[1:]:
        other = svc.loops[name]
        if other.owner.state in LIVE:
            reason = f"prefill {prefill} was relaunched and the pair is unproven ({why})"
            other.enqueue(Command("restart", reason, actor="supervisor"))
            log.info("pd.restart_decode", decode=name, prefill=prefill, why=why)


def heartbeat_window(svc: Services) -> float:
    """The longest time any decode that is up keeps a prefill whose bootstrap endpoint went dark (0 with none up:
    a decode relaunching knows no prefill): SGLang's heartbeat settings from its environment over the daemon's."""
    windows = [0.0]
    for peer in svc.loops.values():
        if peer.cfg.role is Role.DECODE and _up(peer):
            env = {**os.environ, **peer.cfg.env}
            try:
                interval = float(env.get("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0))
                failures = float(env.get("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2))
            except ValueError:
                interval, failures = 5.0, 2.0
            windows.append(heartbeat_window_s(interval, failures))
    return max(windows)


async def hold_prefill_relaunch(loop: Loop) -> bool:
    """A prefill relaunches once its decodes have surely dropped the old one (`policies.pd.relaunch_hold_s`);
    False when the loop is stopping or was paused meanwhile (launch nothing)."""
    if loop.cfg.role is not Role.PREFILL:
        return True
    window = heartbeat_window(loop.svc)
    hold = relaunch_hold_s(loop.owner.released_at, window, loop.clock.monotonic())
    if hold > 0:
        why = f"holding the relaunch {hold:.0f}s: a decode drops the old prefill after {window:g}s of silence"
        loop.owner.transition(S.STARTING, why)
        loop.log.info("pd.relaunch_held", hold_s=round(hold, 1), window_s=window)
        await loop.sleep_interruptible(hold)
    return not loop.stopping and not loop.owner.paused
