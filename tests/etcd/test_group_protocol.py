"""The group protocol between two nodes over a real etcd: one bump per fault, barrier, outages, partitions."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from policies.group import Phase
from tests.etcd.group_support import LEASE_TTL_S, Seat, seat
from tests.etcd.support import EtcdServer, Proxy
from tests.support.wait import wait_until

pytestmark = pytest.mark.etcd


def generation(s: Seat) -> int:
    """The generation this node last read."""
    return s.member.current.number if s.member.current else 0


def both_run(a: Seat, b: Seat, g: int) -> bool:
    """Both trees run generation `g` and both nodes published it."""
    return all(
        s.tree.running and s.tree.launched[-1:] == [g] and s.node.phase is Phase.RUNNING for s in (a, b)
    ) and all(
        m.generation == g and m.state == "serving"
        for s in (a, b)
        for m in [s.member.members.get(0), s.member.members.get(1)]
        if m is not None
    )


@pytest.fixture
async def pair(etcd: EtcdServer) -> AsyncIterator[tuple[Seat, Seat]]:
    """Node 0 and node 1 of a 2-node group, both started and serving generation 1."""
    a, b = seat(etcd.url, 0), seat(etcd.url, 1)
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: both_run(a, b, 1), 20, "both nodes launching generation 1 together")
        yield a, b
    finally:
        await a.stop()
        await b.stop()


async def test_a_new_group_launches_every_node_once_at_generation_1(pair: tuple[Seat, Seat]) -> None:
    """Two daemons joining a new group create generation 1 once; each launches once, after both released."""
    a, b = pair
    assert a.tree.launched == [1] and b.tree.launched == [1]
    assert a.node.group_up and b.node.group_up
    assert a.member.status()["members"] == b.member.status()["members"]


async def test_a_fault_on_node_1_restarts_both_nodes_with_one_bump(pair: tuple[Seat, Seat]) -> None:
    """A fault on node 1 bumps to generation 2 once; both nodes release, pass the barrier and relaunch."""
    a, b = pair
    b.node.fault("inc-1", "crash: scheduler_TP9 exited")
    await wait_until(lambda: both_run(a, b, 2), 20, "both nodes relaunched at generation 2")
    assert a.tree.launched == [1, 2] and b.tree.launched == [1, 2]
    assert (a.member.bumps, b.member.bumps) == (0, 1)
    current = a.member.current
    assert current is not None and current.incident == "inc-1" and current.by_rank == 1
    assert "TP9" in current.reason


async def test_both_nodes_seeing_the_fault_at_once_still_bump_once(pair: tuple[Seat, Seat]) -> None:
    """Node 0 (ranks blocked) and node 1 (rank dead) report together: one bump, one relaunch each."""
    a, b = pair
    a.node.fault("inc-a", "collective_hang: ranks blocked")
    b.node.fault("inc-b", "crash: rank died")
    await wait_until(lambda: both_run(a, b, 2), 20, "both nodes relaunched at generation 2")
    assert a.member.bumps + b.member.bumps == 1
    assert generation(a) == generation(b) == 2
    assert a.tree.launched == b.tree.launched == [1, 2]


async def test_a_killed_daemon_expires_and_the_group_restarts_when_it_returns(etcd: EtcdServer) -> None:
    """Node 1's daemon dies: its lease expires, node 0 bumps and waits at the barrier; it rejoins, both launch."""
    a, b = seat(etcd.url, 0), seat(etcd.url, 1)
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: both_run(a, b, 1), 20, "generation 1 up")
        await b.crash()
        await wait_until(
            lambda: generation(a) == 2, 5 * LEASE_TTL_S + 10, "node 0 bumping after node 1's lease expired"
        )
        assert a.member.member_losses == 1 and "node 1 lost" in (a.member.current.reason or "")  # type: ignore[union-attr]
        await wait_until(lambda: a.node.phase is Phase.RELEASED, 20, "node 0 released and waiting")
        assert not a.tree.running and a.member.status()["barrier"]["missing"] == [1]  # type: ignore[index]
        b2 = seat(etcd.url, 1)
        b2.tree.running = True  # the dead daemon's tree is still there
        await b2.start(local_generation=1)
        try:
            await wait_until(lambda: both_run(a, b2, 2), 20, "both nodes relaunched at generation 2")
            assert b2.tree.releases == 1 and a.tree.launched == [1, 2] and b2.tree.launched == [2]
            assert a.member.bumps + b2.member.bumps == 1
        finally:
            await b2.stop()
    finally:
        await a.stop()
        await b.stop()


async def test_etcd_down_keeps_healthy_servers_and_defers_a_fault_until_it_returns(
    etcd: EtcdServer, pair: tuple[Seat, Seat]
) -> None:
    """etcd stopped: nothing is stopped, both alert; a fault meanwhile relaunches nothing until etcd is back."""
    a, b = pair
    etcd.stop()
    await wait_until(
        lambda: not a.member.reachable and not b.member.reachable, 20, "both nodes noticing etcd gone"
    )
    assert ("group.etcd_unreachable" in [e for e, _ in a.alerts]) and b.alerts[0][
        0
    ] == "group.etcd_unreachable"
    b.node.fault("inc-9", "crash: rank died while etcd was down")
    for _ in range(10):
        await b.node.step()
    assert a.tree.running and b.tree.running and a.tree.launched == b.tree.launched == [1]
    etcd.start()
    await wait_until(
        lambda: both_run(a, b, 2), 30, "the deferred fault restarting the group once etcd answers"
    )
    assert a.member.bumps + b.member.bumps == 1
    assert ("group.etcd_reachable" in [e for e, _ in a.alerts]) and a.tree.launched == [1, 2]


async def test_etcd_restart_without_a_fault_changes_nothing(
    etcd: EtcdServer, pair: tuple[Seat, Seat]
) -> None:
    """A short etcd outage with healthy nodes ends with the same generation and no relaunch."""
    a, b = pair
    etcd.stop()
    await wait_until(lambda: not a.member.reachable, 20, "node 0 noticing etcd gone")
    etcd.start()
    await wait_until(lambda: a.member.reachable and b.member.reachable, 30, "both nodes reconnected")
    await wait_until(lambda: set(a.member.members) == {0, 1}, 20, "both members listed again")
    assert generation(a) == generation(b) == 1
    assert a.tree.launched == b.tree.launched == [1] and a.tree.running and b.tree.running


async def test_a_partitioned_node_never_relaunches_alone(etcd: EtcdServer, proxy: Proxy) -> None:
    """Node 1 cut off from etcd: node 0 restarts the group; node 1 neither relaunches nor is left out."""
    a, b = seat(etcd.url, 0), seat(proxy.url, 1)
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: both_run(a, b, 1), 20, "generation 1 up")
        proxy.cut()
        await wait_until(
            lambda: generation(a) == 2, 5 * LEASE_TTL_S + 10, "node 0 bumping after node 1's lease expired"
        )
        await wait_until(
            lambda: a.node.phase is Phase.RELEASED, 20, "node 0 released and waiting at the barrier"
        )
        await wait_until(lambda: not b.member.reachable, 20, "node 1 noticing the partition")
        for _ in range(10):
            await b.node.step()
        assert b.tree.launched == [1] and not b.member.reachable
        assert a.tree.launched == [1] and not a.tree.running
        proxy.heal()
        await wait_until(
            lambda: both_run(a, b, 2), 30, "both nodes relaunched at generation 2 after the partition"
        )
        assert a.member.bumps + b.member.bumps == 1
    finally:
        await a.stop()
        await b.stop()


async def test_a_barrier_past_its_timeout_alerts_and_still_waits(etcd: EtcdServer) -> None:
    """A node whose peer never releases alerts 'group.barrier_stuck' once and does not launch alone."""
    a = seat(etcd.url, 0, barrier_timeout_s=0.5)
    await a.start()
    try:
        await wait_until(lambda: a.node.phase is Phase.RELEASED, 20, "node 0 released for generation 1")
        await wait_until(lambda: "group.barrier_stuck" in [e for e, _ in a.alerts], 20, "the barrier alert")
        assert a.tree.launched == [] and a.member.status()["barrier"]["missing"] == [1]  # type: ignore[index]
    finally:
        await a.stop()


async def test_a_daemon_restarted_within_its_ttl_restarts_the_group_once(pair: tuple[Seat, Seat]) -> None:
    """Node 1's daemon comes back before its lease expires: it reports its lost tree; one bump, both relaunch."""
    a, b = pair
    endpoint = b.member.client.settings.endpoints[0]
    await b.crash()
    b2 = seat(endpoint, 1)
    await b2.start(local_generation=1)
    try:
        await wait_until(lambda: both_run(a, b2, 2), 20, "both nodes relaunched at generation 2")
        assert a.member.bumps + b2.member.bumps == 1 and "rejoined" in a.member.current.reason  # type: ignore[union-attr]
        assert a.member.member_losses == 0
    finally:
        await b2.stop()
