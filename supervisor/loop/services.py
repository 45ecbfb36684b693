"""What every server loop shares: config, state file, metrics, incidents, the host, the clock, its peers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog

from policies.model import Observation
from supervisor.config import Config, ServerConfig
from supervisor.loop.clock import Clock
from supervisor.loop.commands import Command
from supervisor.loop.host import Host
from supervisor.loop.incidents import IncidentBook
from supervisor.loop.owner import ServerOwner
from supervisor.records.statefile import StateFile
from supervisor.reporting.metrics import SupervisorMetrics

if TYPE_CHECKING:
    from supervisor.gateway.membership import Membership
    from supervisor.group.member import GroupMember


class Peer(Protocol):
    """What one server loop sees of another of the same deployment (PD ordering, a decode's prefills)."""

    @property
    def cfg(self) -> ServerConfig: ...

    @property
    def owner(self) -> ServerOwner: ...

    def latest_progress(self) -> Observation | None: ...

    def latest_health(self) -> Observation | None: ...

    def enqueue(self, cmd: Command) -> None: ...


@dataclass
class Services:
    """What every server loop shares; the daemon owns it (`config` is swapped on reload)."""

    config: Config
    statefile: StateFile
    metrics: SupervisorMetrics
    incidents: IncidentBook
    host: Host
    clock: Clock
    on_state_change: Callable[[], None] = lambda: None
    loops: dict[str, Peer] = field(default_factory=dict)
    group: GroupMember | None = None  # this host's seat in a multi-node group (`[group]`), if any
    gateway: Membership | None = None  # this daemon's servers in SGLang's gateway (`[gateway]`), if any

    def save_state(self) -> None:
        """Persist state.json (a failure is logged and alerted, never raised into a loop)."""
        try:
            self.statefile.save()
        except OSError as exc:
            structlog.get_logger().error("state.save_failed", error=str(exc))
            self.incidents.write_failed("state", exc, self.clock.wall())
        else:
            self.incidents.write_ok("state", self.clock.wall())
