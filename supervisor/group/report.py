"""The group on the on-call surface: metrics from a `GroupMember`, and lines for `sglang-supervisor status`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.group.member import GroupMember
from supervisor.reporting.metrics import SupervisorMetrics


class GroupReporter:
    """Publishes one member's view of its group as `sglang_supervisor_group_*` metrics."""

    def __init__(self, member: GroupMember, metrics: SupervisorMetrics) -> None:
        self.member = member
        self.metrics = metrics
        self._bumps = 0

    def publish(self) -> None:
        """Refresh every group metric from the member's last read (call once per loop tick)."""
        m, name = self.member, self.member.params.name
        generation = m.current.number if m.current else 0
        self.metrics.set_group(
            name, generation, m.reachable, m.barrier_waited_s(), m.params.barrier_timeout_s
        )
        for rank in range(m.params.nnodes):
            member = m.members.get(rank)
            self.metrics.set_group_member(name, rank, member.phase.value if member else "absent")
        for _ in range(m.bumps - self._bumps):
            self.metrics.group_bump(name)
        self._bumps = m.bumps


def render_group(group: Mapping[str, Any]) -> list[str]:
    """The group block of `sglang-supervisor status`: generation, etcd, barrier, one line per member."""
    etcd = "reachable" if group.get("etcd_reachable") else "UNREACHABLE (watching locally, no relaunch)"
    lines = [
        f"group {group['name']}: node {group['node_rank']} of {group['nnodes']}, "
        f"generation {group.get('generation')}, etcd {etcd}"
    ]
    if group.get("reason"):
        lines.append(f"  generation began: {group['reason']} (incident {group.get('incident') or '-'})")
    barrier = group.get("barrier") or {}
    if barrier.get("waited_s"):
        lines.append(f"  barrier: waiting {barrier['waited_s']:.0f}s for nodes {barrier.get('missing')}")
    members = group.get("members") or {}
    for rank in range(int(group["nnodes"])):
        m = members.get(str(rank))
        if m is None:
            lines.append(f"  node {rank}: absent (no lease)")
        else:
            lines.append(
                f"  node {rank}: {m['phase']:<9} generation {m['generation']}  {m.get('state') or '-':<10} {m.get('host', '')}"
            )
    return lines
