"""Two (or more) group nodes in one test process, each with a stand-in server tree, over a real etcd."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from policies.group import Generation
from supervisor.group.etcd import EtcdClient, EtcdSettings
from supervisor.group.member import GroupMember, GroupParams
from supervisor.group.node import GroupNode

LEASE_TTL_S = 2  # etcd's minimum


@dataclass
class FakeTree:
    """A server tree that only records what the protocol did to it."""

    running: bool = False
    launched: list[int] = field(default_factory=list)  # generations launched, in order
    releases: int = 0

    async def release(self) -> bool:
        """Stop and release: always succeeds."""
        self.running = False
        self.releases += 1
        return True

    async def launch(self, generation: Generation) -> None:
        """Start the tree for `generation`."""
        self.running = True
        self.launched.append(generation.number)

    def state(self) -> str:
        """serving while launched, stopped otherwise."""
        return "serving" if self.running else "stopped"


@dataclass
class Seat:
    """One node of the test group: its member, its driver, its tree, the alerts it raised."""

    member: GroupMember
    node: GroupNode
    tree: FakeTree
    alerts: list[tuple[str, str]]
    task: asyncio.Task[None] | None = None

    async def start(self, local_generation: int = 0) -> None:
        """Join the group and follow it in the background."""
        await self.node.start(local_generation)
        self.task = asyncio.create_task(self.node.run())

    async def crash(self) -> None:
        """The daemon dies without a word (SIGKILL): tasks gone, lease left to expire, tree left running."""
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.member.close(revoke=False)
        await self.member.client.close()

    async def stop(self) -> None:
        """Leave the group at test end."""
        await self.crash()


def seat(endpoint: str, rank: int, nnodes: int = 2, name: str = "g", barrier_timeout_s: float = 60.0) -> Seat:
    """A node of group `name`, talking to etcd at `endpoint`."""
    alerts: list[tuple[str, str]] = []

    def alert(event: str, detail: str) -> None:
        alerts.append((event, detail))

    client = EtcdClient(EtcdSettings((endpoint,), timeout_s=1.0))
    params = GroupParams(name, rank, nnodes, LEASE_TTL_S, barrier_timeout_s, retry_s=0.2)
    member = GroupMember(params, client, alert)
    tree = FakeTree()
    return Seat(member, GroupNode(member, tree, alert, tick_s=0.2), tree, alerts)
