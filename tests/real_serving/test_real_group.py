"""The real SGLang server as a 2-node group (tp 2, one rank per node, gloo over loopback) under two daemons and a
real etcd: a rank killed on node 1 restarts both nodes with one generation bump, and the group serves again.

What the real group shows: node 1 runs only its scheduler and a dummy `/health`; node 0's tool canary passes only
when both nodes run their part of every forward. When node 1's rank dies, gloo's TCP connection breaks and node
0's rank dies with it (NCCL on GPUs blocks instead, which the simulator plays), so both daemons may see a crash at
once — still one bump, and both nodes relaunch together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.etcd.support import EtcdServer, group_section
from tests.real_serving.support import READY_S, RealDeployment, one_real_server_at_a_time, serving
from tests.support.ports import free_port


@dataclass
class RealGroupNode(RealDeployment):
    """Node `rank` of a real tp-2 server spread over two "nodes" (one rank each), in group "g"."""

    rank: int = 0
    etcd_url: str = ""
    dist_addr: str = ""

    def write(self) -> None:
        self.tp = 2
        self.extra_args = [
            "--nnodes", "2", "--node-rank", str(self.rank), "--dist-init-addr", self.dist_addr,
        ]  # fmt: skip
        self.env = {**self.env, "SGLANG_CPU_OMP_THREADS_BIND": str(self.rank)}
        if self.rank > 0:  # node 1 answers only a dummy /health
            self.probes = {**self.probes, "canary_mode": "off", "stream_canary_period_s": 0}
        super().write()
        # the default lease (10 s): a real server's start can starve the daemons of CPU for seconds
        with self.config_path.open("a") as fh:
            fh.write(
                group_section(self.name, self.rank, self.etcd_url, lease_ttl_s=10, barrier_timeout_s=300)
            )

    def group(self) -> dict[str, Any]:
        return dict(self.status()["group"])


@contextlib.contextmanager
def real_group(root: Path, python: Path, models: Path) -> Iterator[tuple[RealGroupNode, RealGroupNode]]:
    """etcd and both nodes' daemons started; everything stopped at the end."""
    (root / "etcd").mkdir()
    etcd = EtcdServer(root / "etcd")
    etcd.start()
    nodes: list[RealGroupNode] = []
    try:
        with one_real_server_at_a_time():
            addr = f"127.0.0.1:{free_port()}"
            for rank in (0, 1):
                (root / f"node{rank}").mkdir()
                nodes.append(
                    RealGroupNode(
                        root / f"node{rank}",
                        python=python,
                        models=models,
                        parsers=("qwen", None),
                        rank=rank,
                        etcd_url=etcd.url,
                        dist_addr=addr,
                    )
                )
            for node in nodes:
                node.start()
            yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.cleanup()
        etcd.stop()


def test_a_rank_killed_on_node_1_restarts_the_real_group_with_one_bump(
    tmp_path: Path, serving_python: Path, models: Path
) -> None:
    """Both nodes serve (node 0's canary through both); node 1's TP1 SIGKILLed → generation 2, both relaunched."""
    with real_group(tmp_path, serving_python, models) as (n0, n1):
        for node in (n0, n1):
            node.wait(serving, READY_S, f"node {node.rank} serving")
        n0.wait(lambda s: bool(n0.group()["group_up"]), READY_S, "node 0 seeing both nodes up")
        first = n0.server()
        assert first["probes"]["probes"]["canary_tool"]["values"]["verdict"] == "pass"
        assert n0.group()["generation"] == 1
        before = (first["pid"], n1.server()["pid"])
        n1.ranks(before[1])["sglang::scheduler_TP1"].kill()
        for node in (n0, n1):
            node.wait(
                lambda s: serving(s) and s["pid"] not in before,
                READY_S,
                f"node {node.rank} relaunched and serving",
            )
        g0, g1 = n0.group(), n1.group()
        assert g0["generation"] == g1["generation"] == 2, (g0, g1)
        assert "crash" in g0["reason"]
        again = n0.server()["probes"]["probes"]["canary_tool"]
        assert again["values"]["verdict"] == "pass", "the relaunched group answers through both nodes"
