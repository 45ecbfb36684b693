"""What the watch, the recovery and the group steps use of a server loop — an interface, so that they depend on
it and not on `supervisor.loop.server`, which composes them.

The state itself is changed only through `owner` (`supervisor.loop.owner.ServerOwner`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from policies.decide import Next
from policies.model import Fault, Observation
from policies.plan import Plan
from policies.triage import PlanFacts
from supervisor.config import ServerConfig
from supervisor.host import proctree
from supervisor.loop.clock import Clock
from supervisor.loop.commands import Command, Outcome
from supervisor.loop.owner import ServerOwner
from supervisor.loop.services import Services


class WatchView(Protocol):
    """The watch of the current launch, as the recovery and the group steps use it."""

    async def run(self) -> Outcome: ...

    def rank_pids(self) -> dict[int, str]: ...

    def known_descendants(self) -> list[proctree.ProcId]: ...

    def snapshot(self) -> dict[str, Any]: ...

    def latest(self, probe: str) -> Observation | None: ...

    def titles(self) -> list[str]: ...

    def startup_view(self) -> dict[str, Any] | None: ...

    async def aclose(self) -> None: ...


class Loop(Protocol):
    """One server's control loop."""

    cfg: ServerConfig
    svc: Services
    clock: Clock
    name: str
    marker: str
    owner: ServerOwner
    stopping: bool
    skipped_rungs: list[str]
    rng: random.Random
    log: Any

    @property
    def watch(self) -> WatchView: ...

    @property
    def ladders(self) -> dict[str, Any]: ...

    def current_argv(self) -> tuple[str, ...]: ...

    def plan_facts(self) -> PlanFacts: ...

    def plan_with(self, planner: Callable[[Fault], Plan]) -> None: ...

    def decide(self, fault: Fault) -> Next: ...

    def beat(self) -> None: ...

    def busy(self, seconds: float) -> None: ...

    def handle_command(self, cmd: Command) -> str: ...

    def next_command(self) -> Command | None: ...

    async def wait_for_operator(self) -> None: ...

    async def sleep_interruptible(self, seconds: float) -> None: ...

    def operator_entry(self, action: str, cmd: Command) -> None: ...

    def became_serving(self, unproven: str, alert: bool = True) -> None: ...

    def set_unproven(self, why: str, alert: bool = True) -> None: ...

    async def launch_and_watch(self) -> Outcome: ...

    async def learn_flags(self) -> None: ...
