"""Two daemons, each owning one node of a simulated 2-node tp-16 group, through a real etcd: figures, no asserts.

Figures: a scheduler rank SIGKILLed on node 1 → both daemons report their node `serving` again (node 0's canary
passed through both nodes); generation bumps per fault; etcd's write load per minute while the group is idle
(raft proposals, puts and transactions, from etcd's own /metrics). Lease TTL 2 s (etcd's minimum) so a lost
node shows quickly; keepalives are not raft writes.

Run: ``.venv/bin/python -m benchmarks.bench_group [--quick]``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import parser, say, summary, wait_for, write_result
from tests.etcd.support import EtcdServer, GroupDeployment
from tests.support.ports import free_port

READY_S = 180.0


def etcd_writes(url: str) -> dict[str, float]:
    """etcd's counters of raft proposals, puts and transactions."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read(8 << 20).decode()
    out = {}
    for name in ("etcd_server_proposals_committed_total", "etcd_mvcc_put_total", "etcd_mvcc_txn_total"):
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        out[name] = float(found.group(1)) if found else 0.0
    return out


def kill_rank(dep: GroupDeployment, title: str) -> None:
    """SIGKILL the scheduler titled `title` in `dep`'s tree."""
    for proc in psutil.Process(dep.server()["pid"]).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(title):
                os.kill(proc.pid, signal.SIGKILL)
                return


def generation(dep: GroupDeployment) -> int:
    """The group generation `dep`'s daemon reports (0 when it cannot be read)."""
    try:
        return int(dep.group()["generation"] or 0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def all_serving(nodes: list[GroupDeployment], g: int) -> bool:
    """Every daemon reports its node serving at generation `g`, and node 0 sees the whole group up."""
    try:
        return all(n.server()["state"] == "serving" and generation(n) == g for n in nodes) and bool(
            nodes[0].group()["group_up"]
        )
    except (OSError, ValueError, KeyError):
        return False


def bench(quick: bool) -> dict[str, Any]:
    """Start etcd and both daemons, measure idle load, then kill a rank on node 1 a few times."""
    result: dict[str, Any] = {"nnodes": 2, "tp": 16, "lease_ttl_s": 2}
    with tempfile.TemporaryDirectory(prefix="bench-group-") as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root)
        etcd.start()
        addr = f"127.0.0.1:{free_port()}"
        nodes: list[GroupDeployment] = []
        try:
            for rank in (0, 1):
                (root / f"node{rank}").mkdir()
                nodes.append(
                    GroupDeployment(root / f"node{rank}", rank=rank, etcd_url=etcd.url, dist_addr=addr)
                )
            for n in nodes:
                n.start()
            if not wait_for(lambda: all_serving(nodes, 1), READY_S):
                raise RuntimeError("the group never served generation 1:\n" + nodes[0].log_tail())
            window = 20.0 if quick else 60.0
            before = etcd_writes(etcd.url)
            time.sleep(window)
            after = etcd_writes(etcd.url)
            result["idle_per_minute"] = {k: round((after[k] - before[k]) * 60 / window, 1) for k in after}
            say(f"idle etcd load per minute: {result['idle_per_minute']}")
            times, bumps = [], []
            for i in range(1 if quick else 3):
                g = generation(nodes[0])
                t0 = time.monotonic()
                kill_rank(nodes[1], "sglang::scheduler_TP15")

                def settled(g: int = g) -> bool:
                    return all_serving(nodes, g + 1) or generation(nodes[0]) > g + 1

                if not wait_for(settled, READY_S):
                    say(f"round {i}: the group did not serve again")
                    continue
                times.append(time.monotonic() - t0)
                bumps.append(generation(nodes[0]) - g)
                say(
                    f"round {i}: rank kill on node 1 → both nodes serving in {times[-1]:.2f} s, bumps {bumps[-1]}"
                )
            result["kill_to_group_serving_s"] = summary(times)
            result["bumps_per_fault"] = bumps
        finally:
            for n in nodes:
                n.cleanup()
            etcd.stop()
    return result


def main() -> None:
    """Entry point: print the figures and write benchmarks/results/group.json."""
    args = parser(__doc__).parse_args()
    result = bench(args.quick)
    path = write_result("group", result)
    print(f"rank kill on node 1 → both nodes serving: {result.get('kill_to_group_serving_s')}")
    print(f"generation bumps per fault: {result.get('bumps_per_fault')}")
    print(f"etcd load per minute while idle: {result.get('idle_per_minute')}  ({path})")


if __name__ == "__main__":
    main()
