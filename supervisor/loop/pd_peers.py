"""What a PD worker's loop reads of the other servers of its deployment: the pair its canary goes through, the
partner it waits for, a decode's prefills (policies.pd judges them).

A partner is up when its newest `/health` answered 200 in a launch that is starting or serving: a prefill and
its decode start together, and each proves the pair as soon as the other answers.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from policies.model import Observation
from policies.pd import Role, restart_order
from policies.states import ServerState
from probes.pd_pair import PdPair
from supervisor.loop.commands import Command
from supervisor.loop.services import Peer, Services

S = ServerState
PARTNER = {Role.PREFILL: Role.DECODE, Role.DECODE: Role.PREFILL}
LIVE = (S.STARTING, S.SERVING, S.DEGRADED)


def _up(peer: Peer) -> bool:
    health = peer.latest_health()
    return peer.owner.state in LIVE and health is not None and health.ok


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
    """The role a PD worker waits for to prove the pair ('' when one is up, or not a PD worker)."""
    me = svc.loops.get(name)
    if me is None or me.cfg.role not in PARTNER or pair(svc, name) is not None:
        return ""
    return PARTNER[me.cfg.role].value


def prefills(svc: Services, name: str) -> tuple[Observation | None, ...]:
    """A decode: each prefill's newest progress observation (None for one not serving); others: none."""
    me = svc.loops.get(name)
    if me is None or me.cfg.role is not Role.DECODE:
        return ()
    return tuple(p.latest_progress() for p in svc.loops.values() if p.cfg.role is Role.PREFILL)


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
