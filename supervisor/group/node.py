"""The node side of the group protocol: follow the group's orders with one local server.

`GroupNode.run()` is the loop a daemon runs per grouped server: it asks `GroupMember.order()` what to do,
does it through the small `GroupedServer` adapter (release, launch, state), publishes the outcome, and
waits for the next change. Local faults enter through `fault()`: they bump the group's generation instead
of relaunching alone; while etcd is unreachable the fault is kept and bumped when etcd answers again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from policies.group import Generation, Phase, Step, barrier_overdue, group_up
from policies.plan import Plan
from supervisor.group.etcd import EtcdUnavailable
from supervisor.group.member import Alert, GroupMember

log = structlog.get_logger("supervisor.group")


class GroupedServer(Protocol):
    """What the protocol needs of the local server (the control loop adapts its runtime to this)."""

    async def release(self) -> bool:
        """Stop the tree, reap it, verify the GPUs free; True when they are."""

    async def launch(self, generation: Generation) -> None:
        """Launch the tree for `generation`, with the group's ladder levels."""

    def state(self) -> str:
        """The local server's state name (starting, serving, degraded, …)."""


@dataclass
class PendingFault:
    """A local fault waiting for etcd so that it can bump the group."""

    generation: int
    incident: str
    reason: str
    plan: Callable[[Generation], Plan] | None


class GroupNode:
    """Drives one local server through the group's generations."""

    def __init__(self, member: GroupMember, server: GroupedServer, alert: Alert, tick_s: float = 0.5) -> None:
        self.member = member
        self.server = server
        self.alert = alert
        self.tick_s = tick_s
        self.generation = 0
        self.phase = Phase.JOINING
        self.pending: PendingFault | None = None
        self.launches = 0
        self._published: tuple[int, Phase, str] | None = None
        self._barrier_alerted = False
        self._wake = asyncio.Event()

    async def start(self, local_generation: int = 0) -> None:
        """Join the group; `local_generation` is the one our tree last ran (from the state file, 0 if none)."""
        self.generation = local_generation
        await self.member.start(local_generation)

    def fault(self, incident: str, reason: str, plan: Callable[[Generation], Plan] | None = None) -> None:
        """A fault of the local tree: the group restarts (one bump per fault), never this node alone."""
        if self.phase is Phase.RUNNING and self.pending is None:
            self.pending = PendingFault(self.generation, incident, reason, plan)
            self._wake.set()

    @property
    def group_up(self) -> bool:
        """True when every node runs the current generation and is up (node 0 serves only then)."""
        current = self.member.current
        return current is not None and group_up(self.member.members, current, self.member.params.nnodes)

    async def run(self) -> None:
        """Follow the group until cancelled."""
        while True:
            await self.step()
            waiter = asyncio.create_task(self.member.wait_changed(self.tick_s))
            woken = asyncio.create_task(self._wake.wait())
            await asyncio.wait({waiter, woken}, return_when=asyncio.FIRST_COMPLETED)
            for task in (waiter, woken):
                task.cancel()
            # asyncio.wait never raises a task's own cancellation, so a cancel of run() itself still ends it
            await asyncio.wait({waiter, woken})
            self._wake.clear()

    async def step(self) -> None:
        """One decision and its effect."""
        self._check_rejoin()
        if self.pending is not None and self.member.reachable:
            await self._bump(self.pending)
        order = self.member.order(self.generation, self.phase)
        if order.step is Step.RUN:
            await self._publish(self.server.state())
        elif order.step is Step.RELEASE:
            await self._release(order.generation)
        elif order.step is Step.BARRIER:
            self._check_barrier(order.reason)
        elif order.step is Step.LAUNCH:
            await self._launch(order.generation, order.delay_s)
        elif order.step is Step.HALT and self.phase is not Phase.HALTED:
            self.phase = Phase.HALTED
            self.alert("group.failed", order.reason)
            await self._publish("failed")

    def _check_rejoin(self) -> None:
        """A daemon restarted while the group ran our generation: our tree went with it, so the group restarts."""
        current, rank, g = self.member.current, self.member.params.node_rank, self.generation
        joining = self.phase is Phase.JOINING and self.pending is None
        if joining and current is not None and not current.failed and g == current.number:
            reason = f"node {rank} rejoined: its tree did not survive the daemon restart"
            self.pending = PendingFault(g, f"rejoin-{rank}-g{g}", reason, None)

    async def _bump(self, fault: PendingFault) -> None:
        try:
            result = await self.member.request_restart(
                fault.generation, fault.incident, fault.reason, fault.plan
            )
        except EtcdUnavailable:
            return
        self.pending = None
        log.info("group.fault_reported", generation=result.generation.number, bumped=result.bumped)

    async def _release(self, generation: int) -> None:
        self.phase = Phase.RELEASING
        await self._publish("recovering")
        if not await self.server.release():
            self.alert("group.release_failed", f"GPUs not free for generation {generation}")
            return
        self.generation = generation
        self.pending = None
        try:
            await self.member.mark_released(generation)
        except EtcdUnavailable:
            self.phase = Phase.RELEASING
            return
        self.phase = Phase.RELEASED
        self._published = (generation, Phase.RELEASED, "stopped")
        self._barrier_alerted = False

    def _check_barrier(self, reason: str) -> None:
        timeout = self.member.params.barrier_timeout_s
        if not self._barrier_alerted and barrier_overdue(0.0, self.member.barrier_waited_s(), timeout):
            self._barrier_alerted = True
            log.warning("group.barrier_stuck", reason=reason)
            self.alert("group.barrier_stuck", reason)

    async def _launch(self, generation: int, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        current = self.member.current
        if current is None or current.number != generation:
            return
        await self.server.launch(current)
        self.launches += 1
        self.generation, self.phase = generation, Phase.RUNNING
        await self._publish(self.server.state())

    async def _publish(self, state: str) -> None:
        now = (self.generation, self.phase, state)
        if now == self._published:
            return
        try:
            await self.member.publish(self.generation, self.phase, state)
        except EtcdUnavailable:
            return
        self._published = now
