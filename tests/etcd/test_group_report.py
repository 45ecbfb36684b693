"""The group on the on-call surface: metrics and `status` lines while a node is lost and the barrier waits."""

from __future__ import annotations

import re

import pytest

from policies.group import Phase
from supervisor.cli import render_status
from supervisor.group.report import GroupReporter
from supervisor.reporting.metrics import SupervisorMetrics
from tests.etcd.group_support import LEASE_TTL_S, seat
from tests.etcd.support import EtcdServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.etcd


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in a text exposition."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") and ",".join(sorted(re.findall(r'\w+="[^"]*"', series))) == want:
            return float(value)
    raise AssertionError(f"no series {name}{{{want}}}")


async def test_a_lost_node_shows_as_absent_with_the_barrier_waiting(etcd: EtcdServer) -> None:
    """Node 1 lost: node 0 reports generation 2, its bump, node 1 absent, and the barrier wait in status and metrics."""
    a, b = seat(etcd.url, 0), seat(etcd.url, 1)
    metrics = SupervisorMetrics(version="0.1.0")
    reporter = GroupReporter(a.member, metrics)
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: a.node.group_up, 20, "generation 1 up on both nodes")
        reporter.publish()
        text = metrics.render().decode()
        assert (
            sample(text, "sglang_supervisor_group_member_phase", group="g", node_rank="1", phase="running")
            == 1
        )
        await b.crash()
        await wait_until(
            lambda: a.node.phase is Phase.RELEASED, 5 * LEASE_TTL_S + 10, "node 0 waiting at the barrier"
        )
        await wait_until(lambda: a.member.barrier_waited_s() > 0, 20, "the barrier wait counting")
        reporter.publish()
        text = metrics.render().decode()
        assert sample(text, "sglang_supervisor_group_generation", group="g") == 2
        assert sample(text, "sglang_supervisor_group_generation_bumps_total", group="g") == 1
        assert sample(text, "sglang_supervisor_group_etcd_up", group="g") == 1
        assert sample(text, "sglang_supervisor_group_barrier_wait_seconds", group="g") > 0
        assert (
            sample(text, "sglang_supervisor_group_member_phase", group="g", node_rank="1", phase="running")
            == 0
        )
        screen = render_status({"status_line": "x", "servers": [], "group": a.member.status()})
        assert "generation 2, etcd reachable" in screen and "node 1 lost" in screen
        assert "node 1: absent (no lease)" in screen and "for nodes [1]" in screen
    finally:
        await a.stop()
