"""The server loop of a server that is one node of a multi-node group (`[group]`, docs/group-protocol.md).

Such a server never recovers alone. `run_grouped` replaces `ServerLoop.run_forever` for it: a `GroupNode`
decides (through etcd) when this node stops, releases and launches; `LoopServer` carries those orders out with
the loop's own steps (launch and watch, forensics, stop-reap-release), and turns a fault the watch reports into
a report to the group — one generation bump for the whole group, with the group's ladder and budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from policies.group import Generation, plan_group_restart
from policies.model import Fault
from policies.plan import Plan
from policies.states import ServerState
from supervisor.group.member import GroupMember
from supervisor.group.node import GroupNode
from supervisor.loop import recovery
from supervisor.loop.commands import Outcome

if TYPE_CHECKING:
    from supervisor.loop.context import Loop

S = ServerState


class LoopServer:
    """The `GroupedServer` the protocol drives, made of one `ServerLoop`'s steps."""

    def __init__(self, loop: Loop, member: GroupMember) -> None:
        self.loop = loop
        self.member = member
        self.node: GroupNode | None = None
        self.watching: asyncio.Task[None] | None = None

    def state(self) -> str:
        """The loop's state name."""
        return self.loop.owner.state.value

    async def release(self) -> bool:
        """Stop watching, keep forensics of an open incident, kill, reap and verify the GPUs free."""
        loop = self.loop
        if self.watching is not None:
            self.watching.cancel()
            await asyncio.wait({self.watching})  # a cancel of release() itself still propagates
            self.watching = None
        owner = loop.owner
        if owner.state not in (S.STOPPED, S.RECOVERING, S.FAILED, S.BACKOFF):
            owner.transition(S.RECOVERING, f"group generation {self._next()}: {self._why()}")
        if owner.run is None and not await loop.svc.host.find_marked(loop.marker):
            return True
        report = await recovery.release_run(loop, mode="kill")
        if report.ok and owner.state is S.RECOVERING:
            owner.transition(S.BACKOFF, "released; waiting at the group's barrier")
        return report.ok

    def _next(self) -> int:
        return self.member.current.number if self.member.current else 0

    def _why(self) -> str:
        return self.member.current.reason if self.member.current else "group restart"

    async def launch(self, generation: Generation) -> None:
        """Launch with the group's ladder levels, and watch in the background until a fault or a command."""
        loop = self.loop
        loop.owner.follow_generation(generation.number, generation.levels)
        self.watching = asyncio.create_task(self._watch(generation.number), name=f"group.{loop.name}")

    async def _watch(self, generation: int) -> None:
        loop = self.loop
        outcome = await loop.launch_and_watch()
        if outcome.fault is not None:
            self._report(outcome)
        if outcome.command is not None and self.node is not None:
            loop.operator_entry(outcome.command.kind, outcome.command)
            outcome.command.answer("group restart requested")
            self.node.fault(f"operator-{loop.name}-g{generation}", f"operator {outcome.command.kind}")

    def _report(self, outcome: Outcome) -> None:
        """Record the incident of a fault the watch decided to recover, and report it to the group (the
        alert-only and paused steps were carried out by the watch, which kept watching)."""
        loop, fault, decided = self.loop, outcome.fault, outcome.decided
        assert fault is not None and decided is not None
        now = loop.clock.monotonic()
        latency = max(0.0, now - fault.onset_at) if fault.onset_at is not None else None
        incidents = loop.svc.incidents
        incident = incidents.record_fault(
            incidents.draft_fault(
                loop.name, loop.clock.wall(), fault, decided.plan, loop.owner.argv, loop.owner.rung, latency
            )
        )
        loop.owner.open_incident(incident, now)
        if self.node is None:
            return
        loop.owner.count_restart(fault.kind, streak=False)
        self.node.fault(incident.id, f"{fault.kind}: {fault.reason}", lambda g: self.plan(fault, g))

    def plan(self, fault: Fault, current: Generation | None = None) -> Plan:
        """The group's plan (policies.group): the group's restart streak, ladder history and levels."""
        loop = self.loop
        generation = current or self.member.current or Generation(0)
        return plan_group_restart(fault, loop.plan_facts(), generation, loop.clock.wall())


async def run_grouped(loop: Loop, member: GroupMember) -> None:
    """Follow the group until the daemon stops; then release and leave the group (the others restart)."""
    await recovery.reap_previous(loop)
    await loop.learn_flags()
    server = LoopServer(loop, member)
    loop.plan_with(server.plan)  # every fault of this server is planned with the group's streak and levels
    node = GroupNode(member, server, lambda event, detail: group_alert(loop, event, detail))
    member.alert = node.alert
    server.node = node
    await node.start(loop.owner.group_generation)
    following = asyncio.create_task(node.run(), name=f"group.{member.params.name}")
    try:
        while not loop.stopping:
            loop.beat()
            if server.watching is None or server.watching.done():
                while (cmd := loop.next_command()) is not None:
                    loop.handle_command(cmd)
            await loop.clock.sleep(loop.svc.config.supervisor.tick_s)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        if server.watching is not None:
            server.watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server.watching
        await recovery.stop_for_good(loop)
        await member.close(revoke=True)
        await member.client.close()


def group_alert(loop: Loop, event: str, detail: str) -> None:
    """A group event that needs a human: a journal entry and an alert through the configured sinks."""
    severity = "page" if event in ("group.barrier_stuck", "group.failed") else "warning"
    loop.svc.incidents.notice(
        loop.name,
        loop.clock.wall(),
        event,
        "alert",
        detail,
        {},
        loop.owner.argv,
        loop.owner.rung,
        severity=severity,
    )
