"""A 2-node simulated group (tp-4, two ranks per node) coordinated through a real etcd: figures, no asserts.

Each node is driven by the group protocol (`supervisor.group`) with the daemon's own launch and release steps
(`supervisor.host.launcher`, `stop_and_release`); a node reports a fault when its tree exits or, on node 0,
when /health fails three times. Figures: a rank SIGKILLed on node 1 → both nodes serving again (node 0's
/health 200 and a generate through both nodes); generation bumps per fault; etcd's write load per minute while
the group is idle (raft proposals and puts, from etcd's own /metrics).

Run: ``.venv/bin/python -m benchmarks.bench_group [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import parser, say, summary, write_result
from policies.group import Generation
from supervisor.config import Config, parse_config
from supervisor.group.etcd import EtcdClient, EtcdSettings
from supervisor.group.member import GroupMember, GroupParams
from supervisor.group.node import GroupNode
from supervisor.host import gpu, launcher
from supervisor.host.release import stop_and_release
from tests.e2e.support import free_port_block
from tests.etcd.support import EtcdServer

NNODES, TP = 2, 4
GENERATE = b'{"text": "hi", "sampling_params": {"max_new_tokens": 4}}'


def http_status(url: str, body: bytes | None = None, timeout: float = 2.0) -> int:
    """The status of a GET (or POST of `body`), 0 when there is no answer."""
    try:
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read(1 << 16)
            return int(resp.status)
    except (OSError, ValueError):
        return 0


def node_config(root: Path, rank: int, port: int, addr: str) -> Config:
    """The config a daemon of node `rank` would load (simulator command, sim GPUs of its own)."""
    sim = root / f"sim{rank}"
    args = ["--model-path", "Qwen/Qwen3-8B", "--tp-size", str(TP), "--nnodes", str(NNODES)]
    args += ["--node-rank", str(rank), "--dist-init-addr", addr, "--port", str(port)]
    doc: dict[str, Any] = {
        "supervisor": {
            "state_dir": str(root / f"state{rank}"),
            "log_dir": str(root / f"log{rank}"),
            "shm_dir": str(sim / "shm"),
            "gpu_backend": "sim",
            "sim_state_dir": str(sim),
            "release_deadline_s": 20,
        },
        "servers": [
            {
                "name": "dsv3",
                "command": [sys.executable, "-m", "simulator.launch_server"],
                "args": args,
                "gpus": list(range(TP // NNODES)),
                "gpu_device_paths": [str(sim / "dev" / f"nvidia{g}") for g in range(TP // NNODES)],
                "ports": [port + 2],
                "env": {
                    "SGLANG_SIM_STATE_DIR": str(sim),
                    "SGLANG_SIM_SHM_DIR": str(sim / "shm"),
                    "SGLANG_SIM_STARTUP_S": "0.3",
                    "SGLANG_SIM_DIST_INIT_TIMEOUT_S": "30",
                    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
                    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
                },
            }
        ],
    }
    return parse_config(doc, base_dir=root, env={})


class SimNode:
    """The local server of one node, as the group protocol drives it (what the control loop will adapt)."""

    def __init__(self, config: Config, rank: int) -> None:
        self.config = config
        self.cfg = config.servers[0]
        self.rank = rank
        self.marker = f"dsv3@bench-{uuid.uuid4().hex[:8]}"
        self.backend = gpu.open_backend("sim", config.supervisor.sim_state_dir)
        self.launched: launcher.Launched | None = None
        self.run_id = ""
        self.node: GroupNode | None = None
        self._state = "stopped"
        self._watch: asyncio.Task[None] | None = None

    def state(self) -> str:
        """stopped · starting · serving · crashed."""
        return self._state

    async def release(self) -> bool:
        """Stop (SIGKILL), reap and verify the stand-in GPUs free, as the daemon does."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        tree = self.launched
        report = await stop_and_release(
            self.cfg,
            self.config.supervisor,
            self.backend,
            main_pid=tree.pid if tree else None,
            pgid=tree.pgid if tree else None,
            run_id=self.run_id,
            mode="kill",
            known=[],
            any_run_of=self.marker,
        )
        if tree is not None:
            tree.close()
        self.launched, self._state = None, "stopped"
        return report.ok

    async def launch(self, generation: Generation) -> None:
        """Start this node's tree for `generation` and watch it."""
        self.run_id = uuid.uuid4().hex[:12]
        log_dir = Path(self.config.supervisor.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        started = launcher.spawn(
            self.cfg.argv, self.cfg.env, self.cfg.gpus, self.run_id, self.marker, log_dir / "dsv3.log"
        )
        if isinstance(started, launcher.SpawnFailed):
            self._state = "crashed"
            return
        self.launched, self._state = started, "starting"
        self._watch = asyncio.create_task(self._watch_tree(generation.number))

    async def _watch_tree(self, generation: int) -> None:
        base = f"http://127.0.0.1:{self.cfg.http_port}"
        failures = 0
        while True:
            await asyncio.sleep(0.2)
            assert self.launched is not None
            if self.launched.returncode() is not None:
                self._fault(generation, "crash: the node's tree exited")
                return
            ok = await asyncio.to_thread(http_status, base + "/health")
            if self._state == "starting" and ok == 200:
                answered = 200
                if self.rank == 0:
                    answered = await asyncio.to_thread(http_status, base + "/generate", GENERATE, 10.0)
                self._state = "serving" if answered == 200 else "starting"
            elif self._state == "serving" and self.rank == 0:
                failures = 0 if ok == 200 else failures + 1
                if failures >= 3:
                    self._fault(generation, "collective_hang: /health fails (ranks blocked)")
                    return

    def _fault(self, generation: int, reason: str) -> None:
        self._state = "crashed"
        if self.node is not None:
            self.node.fault(f"bench-{self.rank}-g{generation}", reason)


def etcd_writes(url: str) -> dict[str, float]:
    """etcd's counters of raft proposals and key puts."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read(8 << 20).decode()
    out = {}
    for name in ("etcd_server_proposals_committed_total", "etcd_mvcc_put_total", "etcd_mvcc_txn_total"):
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        out[name] = float(found.group(1)) if found else 0.0
    return out


def kill_rank(node: SimNode, title: str) -> bool:
    """SIGKILL the scheduler titled `title` in node's tree."""
    assert node.launched is not None
    for proc in psutil.Process(node.launched.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(proc.cmdline()).startswith(title):
                os.kill(proc.pid, signal.SIGKILL)
                return True
    return False


async def until(pred: Any, timeout: float) -> bool:
    """Poll `pred()` until true or the deadline (False)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def bench(quick: bool) -> dict[str, Any]:
    """Run the group, measure idle load, then kill a rank on node 1 a few times."""
    with tempfile.TemporaryDirectory(prefix="bench-group-") as tmp:
        root = Path(tmp)
        etcd = EtcdServer(root)
        etcd.start()
        base = free_port_block(12)
        addr = f"127.0.0.1:{base + 10}"
        sims = [SimNode(node_config(root, r, base + 4 * r, addr), r) for r in range(NNODES)]
        members = [
            GroupMember(GroupParams("bench", r, NNODES, 2, 60), EtcdClient(EtcdSettings((etcd.url,))))
            for r in range(NNODES)
        ]
        nodes = [
            GroupNode(m, s, lambda e, d: say(f"alert {e}: {d}"), 0.2)
            for m, s in zip(members, sims, strict=True)
        ]
        for s, n in zip(sims, nodes, strict=True):
            s.node = n
        tasks: list[asyncio.Task[None]] = []
        result: dict[str, Any] = {"nnodes": NNODES, "tp": TP, "lease_ttl_s": 2}
        try:
            for n in nodes:
                await n.start()
                tasks.append(asyncio.create_task(n.run()))

            def serving(g: int) -> bool:
                return all(
                    s.state() == "serving" and n.generation == g for s, n in zip(sims, nodes, strict=True)
                )

            def published(g: int) -> bool:
                seen = members[0].members
                return all(
                    r in seen and seen[r].generation == g and seen[r].state == "serving"
                    for r in range(NNODES)
                )

            if not await until(lambda: serving(1) and published(1), 120):
                raise RuntimeError("the group never served generation 1")
            window = 20.0 if quick else 60.0
            before = etcd_writes(etcd.url)
            await asyncio.sleep(window)
            after = etcd_writes(etcd.url)
            result["idle_per_minute"] = {k: round((after[k] - before[k]) * 60 / window, 1) for k in after}
            say(f"idle etcd load per minute: {result['idle_per_minute']}")
            times, bumps = [], []
            for i in range(1 if quick else 3):
                g = nodes[0].generation
                bumped_before = sum(m.bumps for m in members)
                t0 = time.monotonic()
                kill_rank(sims[1], f"sglang::scheduler_TP{TP - 1}")
                if not await until(lambda g=g: serving(g + 1), 180):
                    say(f"round {i}: the group did not serve generation {g + 1}")
                    continue
                times.append(time.monotonic() - t0)
                bumps.append(sum(m.bumps for m in members) - bumped_before)
                say(
                    f"round {i}: rank kill on node 1 → both nodes serving in {times[-1]:.2f} s, bumps {bumps[-1]}"
                )
            result["kill_to_group_serving_s"] = summary(times)
            result["bumps_per_fault"] = bumps
        finally:
            for t in tasks:
                t.cancel()
            for s in sims:
                await s.release()
            for m in members:
                await m.close()
                await m.client.close()
            etcd.stop()
    return result


def main() -> None:
    """Entry point: print the figures and write benchmarks/results/group.json."""
    args = parser(__doc__).parse_args()
    result = asyncio.run(bench(args.quick))
    path = write_result("group", result)
    print(f"rank kill on node 1 → both nodes serving: {result.get('kill_to_group_serving_s')}")
    print(f"generation bumps per fault: {result.get('bumps_per_fault')}")
    print(f"etcd load per minute while idle: {result.get('idle_per_minute')}  ({path})")


if __name__ == "__main__":
    main()
