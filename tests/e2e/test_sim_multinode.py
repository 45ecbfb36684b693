"""The simulator as a 2-node group over loopback: a rank lost on node 1 blocks node 0; one node alone never recovers."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.sim import FAST_CRASH, Sim, cleanup, start, wait_ready
from tests.support.wait import wait_for

ENV = {**FAST_CRASH, "SGLANG_SIM_DIST_INIT_TIMEOUT_S": "3", "SGLANG_SIM_NCCL_TIMEOUT_S": "600"}
GENERATE = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}


def node(tmp_path: Path, rank: int, addr: str, stack: ExitStack, tag: str = "") -> Sim:
    """Start node `rank` of a tp-4 group over 2 nodes (2 ranks each), in its own state dir."""
    sim = start(
        tmp_path,
        "--tp-size", "4", "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", addr,
        env=ENV,
        name=f"node{rank}{tag}",
        state_dir=tmp_path / f"state{rank}",
    )  # fmt: skip
    stack.callback(cleanup, sim)
    return sim


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[Sim, Sim, str]]:
    """Node 0 and node 1 of one group, both up."""
    addr = f"127.0.0.1:{free_port(1)}"
    with ExitStack() as stack:
        n0 = node(tmp_path, 0, addr, stack)
        n1 = node(tmp_path, 1, addr, stack)
        wait_ready(n0)
        wait_for(lambda: n1.get("/health").status == 200, 60, "node 1's dummy health server")
        yield n0, n1, addr


def generates(sim: Sim, timeout: float = 10.0) -> bool:
    """True when node 0 answers a generate within `timeout`."""
    try:
        return sim.post("/generate", GENERATE, timeout=timeout).status == 200
    except TimeoutError:
        return False


def test_the_group_serves_and_each_node_runs_its_own_ranks(group: tuple[Sim, Sim, str]) -> None:
    """Node 0 serves through both nodes; node 1 runs TP2 and TP3 with no tokenizer or detokenizer."""
    n0, n1, _ = group
    assert generates(n0)
    assert sorted(t for t in n0.titles() if "scheduler" in t) == [
        "sglang::scheduler_TP0",
        "sglang::scheduler_TP1",
    ]
    assert sorted(t for t in n1.titles() if "scheduler" in t) == [
        "sglang::scheduler_TP2",
        "sglang::scheduler_TP3",
    ]
    assert "sglang::detokenizer" not in n1.titles()
    assert n1.get("/health_generate").status == 200


def test_a_rank_killed_on_node_1_blocks_node_0_in_the_collective(group: tuple[Sim, Sim, str]) -> None:
    """Killing TP3 on node 1 ends node 1's tree; node 0 stays up but never finishes another step."""
    n0, n1, _ = group
    os.kill(n1.tree()["sglang::scheduler_TP3"].pid, signal.SIGKILL)
    assert n1.exited(30) != 0
    assert not generates(n0, timeout=3)
    assert n0.proc.poll() is None and "sglang::scheduler_TP0" in n0.titles()


def test_a_rank_stopped_on_node_1_blocks_node_0_while_node_1_looks_healthy(
    group: tuple[Sim, Sim, str],
) -> None:
    """SIGSTOP of TP2 on node 1: node 1's dummy health stays 200, node 0 cannot finish a step."""
    n0, n1, _ = group
    rank = n1.tree()["sglang::scheduler_TP2"]
    os.kill(rank.pid, signal.SIGSTOP)
    try:
        assert not generates(n0, timeout=3)
        assert n1.get("/health").status == 200
    finally:
        os.kill(rank.pid, signal.SIGCONT)


def test_relaunching_only_node_1_never_recovers_the_group(
    tmp_path: Path, group: tuple[Sim, Sim, str]
) -> None:
    """A new node 1 finds no rendezvous (node 0's group formed already) and fails its init; node 0 stays blocked."""
    n0, n1, addr = group
    os.kill(n1.tree()["sglang::scheduler_TP3"].pid, signal.SIGKILL)
    n1.exited(30)
    with ExitStack() as stack:
        again = node(tmp_path, 1, addr, stack, tag="-again")
        assert again.exited(60) != 0
        assert "Timed out after 3 seconds waiting for clients" in again.log()
    assert not generates(n0, timeout=3)


def test_relaunching_only_node_0_never_recovers_the_group(
    tmp_path: Path, group: tuple[Sim, Sim, str]
) -> None:
    """A new node 0 waits at the rendezvous for a node 1 still tied to the old group, then fails its init."""
    n0, _, addr = group
    os.killpg(n0.pid, signal.SIGKILL)
    n0.exited(30)
    with ExitStack() as stack:
        again = node(tmp_path, 0, addr, stack, tag="-again")
        assert again.exited(60) != 0
        assert "1/2 clients joined" in again.log()
