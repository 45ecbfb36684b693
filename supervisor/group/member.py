"""This node's seat in a multi-node group: its etcd lease, its member record, and the group's state as watched.

`GroupMember` is the narrow interface the control loop uses (docs/group-protocol.md):
`start()` / `close()`, `order(local_generation, phase)` (what to do next), `publish(...)` (our phase and
server state), `request_restart(...)` (one generation bump per fault, compared on the generation in one
etcd transaction), `mark_released(G)`, `wait_changed(timeout)` and `status()`. Two background tasks keep
the lease alive and keep a local copy of the group prefix current through a watch. Losing etcd never
raises into the caller: `reachable` turns false, `order()` answers HOLD and an alert fires once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from policies.group import (
    Generation,
    Member,
    Order,
    Phase,
    Step,
    barrier_missing,
    covers,
    decide,
    first_generation,
    group_up,
    member_loss_is_fault,
    next_generation,
)
from policies.plan import Plan
from supervisor.group.etcd import Compare, DeletePrefix, EtcdClient, EtcdUnavailable, Event, KeyValue, Put

log = structlog.get_logger("supervisor.group")

KEY_ROOT = "/sglang-supervisor/groups/"


@dataclass(frozen=True, slots=True)
class GroupParams:
    """What the member needs of the `[group]` config."""

    name: str
    node_rank: int
    nnodes: int
    lease_ttl_s: int = 10
    barrier_timeout_s: float = 300.0
    retry_s: float = 1.0


@dataclass(frozen=True, slots=True)
class BumpResult:
    """The generation after a restart request, and whether this request made it."""

    generation: Generation
    bumped: bool


Alert = Callable[[str, str], None]


class GroupMember:
    """One node's participation in the group; all etcd traffic of the protocol goes through here."""

    def __init__(
        self,
        params: GroupParams,
        client: EtcdClient,
        alert: Alert | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.params = params
        self.client = client
        self.alert = alert or (lambda event, detail: None)
        self.wall = wall
        self.prefix = f"{KEY_ROOT}{params.name}/"
        self.log = log.bind(group=params.name, node_rank=params.node_rank)
        self.lease = 0
        self.reachable = False
        self.current: Generation | None = None
        self.members: dict[int, Member] = {}
        self.released: dict[int, int] = {}  # rank → generation it released
        self.bumps = 0
        self.member_losses = 0
        self.barrier_since: float | None = None
        self._me = Member(params.node_rank, 0, Phase.JOINING, host=socket.gethostname())
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._alerted = False

    # ---- keys ----------------------------------------------------------------------------------------
    @property
    def generation_key(self) -> str:
        """Where the generation record lives."""
        return self.prefix + "generation"

    def member_key(self, rank: int) -> str:
        """Where node `rank` publishes itself (attached to its lease)."""
        return f"{self.prefix}members/{rank}"

    def released_key(self, rank: int) -> str:
        """Where node `rank` records the generation it released (attached to its lease)."""
        return f"{self.prefix}released/{rank}"

    # ---- lifecycle -----------------------------------------------------------------------------------
    async def start(self, local_generation: int = 0) -> None:
        """Join: lease, generation (created if the group is new), member record; then keepalive and watch.

        Never raises for an unreachable etcd: the tasks keep trying, and `order()` answers HOLD meanwhile.
        """
        self._me = Member(self.params.node_rank, local_generation, Phase.JOINING, host=self._me.host)
        with contextlib.suppress(EtcdUnavailable):
            await self._join()
        self._tasks = [
            asyncio.create_task(self._keepalive_loop(), name=f"group-{self.params.name}-keepalive"),
            asyncio.create_task(self._watch_loop(), name=f"group-{self.params.name}-watch"),
        ]

    async def close(self, revoke: bool = True) -> None:
        """Stop the tasks; with `revoke`, drop the lease so the other nodes see this node leave at once."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks = []
        if revoke and self.lease:
            with contextlib.suppress(EtcdUnavailable):
                await self.client.revoke(self.lease)
            self.lease = 0

    async def _join(self) -> None:
        self.lease = await self.client.grant(self.params.lease_ttl_s)
        created = first_generation(self.wall())
        await self.client.txn(
            [Compare(self.generation_key, 0)], [Put(self.generation_key, created.to_json())]
        )
        await self._reload()
        await self._put_me()
        self._set_reachable(True)

    async def _reload(self) -> int:
        kvs, revision = await self.client.get_prefix(self.prefix)
        self.members, self.released = {}, {}
        for kv in kvs:
            self._apply(kv, deleted=False)
        self._changed.set()
        return revision

    # ---- background ----------------------------------------------------------------------------------
    async def _keepalive_loop(self) -> None:
        period = max(0.2, self.params.lease_ttl_s / 3)
        while True:
            await asyncio.sleep(period if self.reachable else self.params.retry_s)
            try:
                if not self.lease:
                    await self._join()
                    continue
                ttl = await self.client.keepalive(self.lease)
                if ttl <= 0:
                    self.log.warning("group.lease_lost", lease=self.lease)
                    self.lease = await self.client.grant(self.params.lease_ttl_s)
                    await self._put_me()
                self._set_reachable(True)
            except EtcdUnavailable as exc:
                self._set_reachable(False, str(exc))

    async def _watch_loop(self) -> None:
        while True:
            try:
                revision = await self._reload()
                self._set_reachable(True)
                async for events in self.client.watch(self.prefix, revision + 1):
                    await self._on_events(events)
            except EtcdUnavailable as exc:
                self._set_reachable(False, str(exc))
            await asyncio.sleep(self.params.retry_s)

    async def _on_events(self, events: list[Event]) -> None:
        lost: list[Member] = []
        for event in events:
            last = self._apply(event.kv, deleted=event.kind == "delete")
            if (
                last is not None
                and last.rank != self.params.node_rank
                and member_loss_is_fault(last, self.current)
            ):
                lost.append(last)
        self._changed.set()
        for member in lost:
            self.member_losses += 1
            reason = f"node {member.rank} lost: its daemon's lease expired"
            self.log.warning("group.member_lost", rank=member.rank, generation=member.generation)
            with contextlib.suppress(EtcdUnavailable):
                await self.request_restart(
                    member.generation, f"lost-{member.rank}-g{member.generation}", reason
                )

    def _apply(self, kv: KeyValue, deleted: bool) -> Member | None:
        """Update the local copy; returns the member a deletion removed."""
        rest = kv.key[len(self.prefix) :]
        try:
            if rest == "generation" and not deleted:
                self.current = Generation.from_json(kv.value)
            elif rest.startswith("members/"):
                rank = int(rest.split("/", 1)[1])
                if deleted:
                    return self.members.pop(rank, None)
                self.members[rank] = Member.from_json(kv.value)
            elif rest.startswith("released/"):
                rank = int(rest.split("/", 1)[1])
                if deleted:
                    self.released.pop(rank, None)
                else:
                    self.released[rank] = int(kv.value)
        except (ValueError, KeyError) as exc:
            self.log.warning("group.bad_record", key=rest, error=str(exc)[:200])
        return None

    def _set_reachable(self, ok: bool, detail: str = "") -> None:
        if ok and not self.reachable:
            self.log.info("group.etcd_reachable")
            if self._alerted:
                self.alert("group.etcd_reachable", "etcd answers again; following the group")
            self._alerted = False
        if not ok and self.reachable:
            self.log.warning("group.etcd_unreachable", detail=detail[:300])
        if not ok and not self._alerted:
            self.alert("group.etcd_unreachable", "etcd unreachable: watching locally, no relaunch")
            self._alerted = True
        if ok != self.reachable:
            self._changed.set()
        self.reachable = ok

    # ---- the loop's interface ------------------------------------------------------------------------
    def order(self, local_generation: int, phase: Phase) -> Order:
        """What this node must do next (pure decision over the last state read)."""
        released = [r for r, g in self.released.items() if self.current and g == self.current.number]
        result = decide(
            self.reachable, self.current, local_generation, phase, released, self.params.nnodes, self.wall()
        )
        if result.step != Step.BARRIER:
            self.barrier_since = None
        elif self.barrier_since is None:
            self.barrier_since = time.monotonic()
        return result

    async def wait_changed(self, timeout_s: float) -> None:
        """Return when the group's state (or reachability) changed, or after `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        self._changed.clear()

    async def publish(self, generation: int, phase: Phase, state: str = "") -> None:
        """Publish this node's generation, phase and server state (raises EtcdUnavailable)."""
        self._me = Member(self.params.node_rank, generation, phase, state, self._me.host, self.wall())
        await self._put_me()

    async def _put_me(self) -> None:
        await self.client.put(self.member_key(self.params.node_rank), self._me.to_json(), self.lease)

    async def mark_released(self, generation: int) -> None:
        """Record "released for generation G" (GPUs verified free) and publish the phase."""
        await self.client.put(self.released_key(self.params.node_rank), str(generation), self.lease)
        self.released[self.params.node_rank] = generation  # our own record, before the watch echoes it
        await self.publish(generation, Phase.RELEASED, "stopped")

    async def request_restart(
        self,
        fault_generation: int,
        incident: str,
        reason: str,
        plan: Callable[[Generation], Plan] | None = None,
    ) -> BumpResult:
        """Bump the generation for a fault seen in `fault_generation`, unless a bump already covers it.

        One etcd transaction compares the generation record's revision with the one read: when several
        nodes see the same fault, exactly one bump wins and the others find it covered. `plan` is the
        group's recovery plan (ladder levels, backoff, fail); without it the group relaunches as it was.
        """
        for _ in range(8):
            kv, _rev = await self.client.get(self.generation_key)
            current = Generation.from_json(kv.value) if kv else first_generation(self.wall())
            if covers(current, fault_generation):
                self.current = current
                return BumpResult(current, False)
            chosen = plan(current) if plan else Plan("relaunch", "group restart", levels=current.levels)
            new = next_generation(current, chosen, incident, reason, self.params.node_rank, self.wall())
            guard = Compare(self.generation_key, kv.mod_revision if kv else 0)
            ops: list[Put | DeletePrefix] = [
                Put(self.generation_key, new.to_json()),
                DeletePrefix(self.prefix + "released/"),
            ]
            if await self.client.txn([guard], ops):
                self.bumps += 1
                self.current = new
                self._changed.set()
                self.log.warning(
                    "group.generation_bumped", generation=new.number, incident=incident, reason=reason
                )
                return BumpResult(new, True)
        raise EtcdUnavailable("generation bump: the record kept changing under eight attempts")

    def barrier_waited_s(self) -> float:
        """Seconds this node has waited at the current barrier (0 when not waiting)."""
        return 0.0 if self.barrier_since is None else time.monotonic() - self.barrier_since

    def status(self) -> dict[str, object]:
        """The group as this node sees it, for `/status` and `status`."""
        g = self.current
        released = sorted(r for r, n in self.released.items() if g and n == g.number)
        return {
            "name": self.params.name,
            "node_rank": self.params.node_rank,
            "nnodes": self.params.nnodes,
            "etcd_reachable": self.reachable,
            "generation": g.number if g else None,
            "incident": g.incident if g else "",
            "reason": g.reason if g else "",
            "failed": g.failed if g else False,
            "group_up": g is not None and group_up(self.members, g, self.params.nnodes),
            "levels": dict(g.levels) if g else {},
            "members": {
                str(r): {"generation": m.generation, "phase": m.phase.value, "state": m.state, "host": m.host}
                for r, m in sorted(self.members.items())
            },
            "barrier": {
                "released": released,
                "missing": barrier_missing(released, self.params.nnodes),
                "waited_s": round(self.barrier_waited_s(), 3),
            },
        }
