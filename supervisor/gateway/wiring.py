"""The daemon's side of gateway membership: what each server wants, from the loops that own them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from policies.membership import Want, member_of
from policies.states import ServerState
from supervisor.config import Config
from supervisor.gateway.client import GatewayClient
from supervisor.gateway.membership import Membership
from supervisor.loop.status_view import engine_pause
from supervisor.reporting.metrics import SupervisorMetrics

if TYPE_CHECKING:
    from supervisor.loop.server import ServerLoop


def want(loop: ServerLoop) -> Want:
    """Whether `loop`'s server belongs in the gateway now (`policies.membership.member_of`)."""
    cfg, owner = loop.cfg, loop.owner
    adopted_unjudged = owner.adopted is not None and owner.state is ServerState.STARTING
    member = member_of(
        cfg.role.value,
        owner.state.value,
        not owner.unproven,
        engine_pause(loop) is not None,
        adopted_unjudged,
    )
    worker_type = cfg.role.value if cfg.role.value in ("prefill", "decode") else "regular"
    return Want(loop.name, cfg.gateway_url, member, worker_type, cfg.bootstrap_port)


def membership(
    config: Config, loops: Callable[[], Sequence[ServerLoop]], metrics: SupervisorMetrics
) -> Membership | None:
    """The membership task of `config`'s `[gateway]`, or None without one."""
    gw = config.gateway
    if gw is None:
        return None
    key = Path(gw.admin_key_file).read_text().strip() or None if gw.admin_key_file else None
    metrics.declare_gateway(s.name for s in config.servers if s.role.value != "router")
    client = GatewayClient(gw.url, key, gw.timeout_s)
    return Membership(
        client, lambda: [want(loop) for loop in loops() if loop.cfg.role.value != "router"], metrics
    )
