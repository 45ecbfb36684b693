"""Two daemons, each owning one node of a simulated 2-node tp-16 group, coordinated through a real etcd."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.etcd.support import EtcdServer, GroupDeployment, ThreadedProxy
from tests.support.ports import free_port

pytestmark = pytest.mark.etcd

READY_S = 120.0


@pytest.fixture
def proxy(etcd: EtcdServer) -> Iterator[ThreadedProxy]:
    """A cuttable proxy in front of etcd, through which node 1's daemon talks to it."""
    p = ThreadedProxy(etcd.client_port)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def pair(
    tmp_path: Path, etcd: EtcdServer, proxy: ThreadedProxy
) -> Iterator[tuple[GroupDeployment, GroupDeployment]]:
    """Both daemons started (node 1 behind the proxy) and their group serving at generation 1."""
    addr = f"127.0.0.1:{free_port()}"
    nodes = []
    for rank, url in ((0, etcd.url), (1, proxy.url)):
        root = tmp_path / f"node{rank}"
        root.mkdir()
        nodes.append(GroupDeployment(root, rank=rank, etcd_url=url, dist_addr=addr))
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait(lambda s: s["state"] == "serving", READY_S, "each node serving")
        yield nodes[0], nodes[1]
    finally:
        for n in nodes:
            n.cleanup()


def kill_rank(dep: GroupDeployment, title: str) -> None:
    """SIGKILL the scheduler of `dep`'s tree titled `title`."""
    os.kill(rank_pid(dep, title), signal.SIGKILL)


def rank_pid(dep: GroupDeployment, title: str) -> int:
    """The PID of the scheduler of `dep`'s tree titled `title`."""
    main = dep.server()["pid"]
    for proc in psutil.Process(main).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(title):
                return int(proc.pid)
    raise AssertionError(f"no {title} under pid {main}")


def test_a_rank_killed_on_node_1_restarts_both_nodes_with_one_bump(
    pair: tuple[GroupDeployment, GroupDeployment],
) -> None:
    """Node 1's TP15 dies: one generation bump, both daemons relaunch their node, both serve again."""
    n0, n1 = pair
    n0.wait(lambda s: bool(n0.group()["group_up"]), READY_S, "node 0 seeing both nodes up")
    generation = n0.group()["generation"]  # 1, unless a loaded start already took one relaunch
    before = (n0.server()["pid"], n1.server()["pid"])
    kill_rank(n1, "sglang::scheduler_TP15")
    for n in (n0, n1):
        n.wait(
            lambda s: s["state"] == "serving" and s["pid"] not in before,
            READY_S,
            "each node relaunched and serving",
        )
    g0, g1 = n0.group(), n1.group()
    assert g0["generation"] == g1["generation"] == generation + 1
    assert "crash" in g0["reason"] and g0["members"]["1"]["state"] == "serving"
    assert n0.status()["servers"][0]["fallback"]["rung"] == n1.status()["servers"][0]["fallback"]["rung"]


def test_both_daemons_detecting_at_once_still_bump_once(
    pair: tuple[GroupDeployment, GroupDeployment],
) -> None:
    """A rank killed on each node in the same instant: both daemons see a crash and race; one generation bump."""
    n0, n1 = pair
    n0.wait(lambda s: bool(n0.group()["group_up"]), READY_S, "node 0 seeing both nodes up")
    before = (n0.server()["pid"], n1.server()["pid"])
    pids = (rank_pid(n0, "sglang::scheduler_TP7"), rank_pid(n1, "sglang::scheduler_TP15"))
    for (
        pid
    ) in pids:  # found first, then killed back to back: a group stop after the first cannot come between
        os.kill(pid, signal.SIGKILL)
    for n in (n0, n1):
        n.wait(
            lambda s: s["state"] == "serving" and s["pid"] not in before,
            READY_S,
            "each node relaunched and serving",
        )
    assert n0.group()["generation"] == n1.group()["generation"] == 2


def test_a_killed_node_1_daemon_restarts_the_group_when_it_returns(
    pair: tuple[GroupDeployment, GroupDeployment],
) -> None:
    """Node 1's daemon SIGKILLed: its lease expires, node 0 releases and waits; the daemon returns, both serve again."""
    n0, n1 = pair
    assert n1.daemon is not None
    os.killpg(n1.daemon.pid, signal.SIGKILL)
    n1.daemon.wait(timeout=10)
    n0.wait(
        lambda s: s["state"] == "backoff" and n0.group()["barrier"]["missing"] == [1],
        READY_S,
        "node 0 released and waiting at the barrier for node 1",
    )
    group = n0.group()
    assert group["generation"] == 2 and "node 1 lost" in group["reason"]
    assert "1" not in group["members"]
    n1.start()
    for n in (n0, n1):
        n.wait(lambda s: s["state"] == "serving", READY_S, "each node serving again")
    assert n0.group()["generation"] == n1.group()["generation"] == 2


def test_etcd_down_changes_nothing_on_healthy_nodes(
    etcd: EtcdServer, pair: tuple[GroupDeployment, GroupDeployment]
) -> None:
    """etcd stopped and started again: both nodes keep serving the same trees at generation 1, etcd flagged."""
    n0, n1 = pair
    pids = (n0.server()["pid"], n1.server()["pid"])
    etcd.stop()
    for n in (n0, n1):
        deadline = READY_S
        n.wait(lambda s, n=n: not n.group()["etcd_reachable"], deadline, "the daemon noticing etcd gone")
        assert n.server()["state"] == "serving"
    etcd.start()
    for n in (n0, n1):
        n.wait(lambda s, n=n: bool(n.group()["etcd_reachable"]), READY_S, "the daemon reconnected")
    assert (n0.server()["pid"], n1.server()["pid"]) == pids
    assert n0.group()["generation"] == n1.group()["generation"] == 1
    assert n0.server()["state"] == n1.server()["state"] == "serving"


def test_a_partitioned_node_never_relaunches_alone(
    proxy: ThreadedProxy, pair: tuple[GroupDeployment, GroupDeployment]
) -> None:
    """Node 1 cut off from etcd: node 0 restarts the group and waits; node 1 keeps its tree; healed, both serve."""
    n0, n1 = pair
    pid1 = n1.server()["pid"]
    proxy.cut()
    n0.wait(
        lambda s: s["state"] == "backoff" and n0.group()["barrier"]["missing"] == [1],
        READY_S,
        "node 0 released after node 1's lease expired, waiting for node 1",
    )
    n1.wait(lambda s: not n1.group()["etcd_reachable"], READY_S, "node 1 noticing the partition")
    assert n0.group()["generation"] == 2
    assert n1.server()["pid"] == pid1 and n1.group()["generation"] == 1
    proxy.heal()
    for n in (n0, n1):
        n.wait(lambda s: s["state"] == "serving" and s["pid"] != pid1, READY_S, "each node serving again")
    assert n0.group()["generation"] == n1.group()["generation"] == 2
