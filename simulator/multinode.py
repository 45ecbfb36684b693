"""A server spread over nodes: `--nnodes N --node-rank R --dist-init-addr HOST:PORT`, coupled over loopback.

Node 0 hosts the rendezvous at `--dist-init-addr` (SGLang's TCP store) and, once every other node has joined,
stops accepting: a group forms once per launch. Every step of node 0 is then a collective across nodes: node 0
sends the batch to each node and waits for each node's answer, with no deadline but NCCL's
(`SGLANG_SIM_NCCL_TIMEOUT_S`, 600 s like NCCL's default), after which its watchdog tears node 0 down. So a rank
killed or stopped on node 1 leaves node 0 blocked in a collective, and a relaunch of one node alone never
recovers the group: a new node 1 finds no rendezvous to join, a new node 0 waits for nodes that never come,
and each gives up after `SGLANG_SIM_DIST_INIT_TIMEOUT_S` (default 60 s).

Nodes ≥ 1 run their schedulers only, behind SGLang's dummy health server (`/ping`, `/health`,
`/health_generate` always 200), with no tokenizer and no detokenizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from aiohttp import web

from simulator.logs import log, uvicorn
from simulator.procs import kill_tree
from simulator.teardown import Crash

if TYPE_CHECKING:
    from simulator.cli import SimServerArgs
    from simulator.launch import Launch

_LINE_MAX = 1 << 16


def _addr(args: SimServerArgs) -> tuple[str, int]:
    host, _, port = str(args.dist_init_addr or "127.0.0.1:5000").rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _timeout(name: str, default: float) -> float:
    return float(os.environ.get(name, "") or default)


class Hub:
    """Node 0's side: the rendezvous, then one collective per step with every other node."""

    def __init__(self, args: SimServerArgs) -> None:
        self.addr = _addr(args)
        self.nnodes = args.nnodes
        self.peers: list[tuple[socket.socket, Any]] = []

    def rendezvous(self) -> bool:
        """Wait for every other node to join; False at the dist-init timeout."""
        deadline = time.monotonic() + _timeout("SGLANG_SIM_DIST_INIT_TIMEOUT_S", 60)
        with socket.create_server(self.addr, reuse_port=False) as server:
            server.settimeout(0.2)
            while len(self.peers) < self.nnodes - 1:
                if time.monotonic() > deadline:
                    return False
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                reader = conn.makefile("rb")
                hello = reader.readline(_LINE_MAX)
                if hello.startswith(b"hello"):
                    self.peers.append((conn, reader))
                else:
                    conn.close()
        return True

    def collective(self, batch: dict[str, object]) -> None:
        """Send the step to every node and wait for all answers; a missing node blocks us until NCCL's timeout."""
        line = json.dumps(batch).encode() + b"\n"
        for conn, _ in self.peers:
            with contextlib.suppress(OSError):
                conn.sendall(line)
        deadline = time.monotonic() + _timeout("SGLANG_SIM_NCCL_TIMEOUT_S", 600)
        for conn, reader in self.peers:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                answer = reader.readline(_LINE_MAX)
            except OSError:
                answer = b""
            if not answer:
                self._block_until(deadline, batch)
        for conn, _ in self.peers:
            conn.settimeout(None)

    def _block_until(self, deadline: float, batch: dict[str, object]) -> None:
        """A node left mid-collective: hang (as NCCL does) until the timeout, then NCCL's watchdog fires."""
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.01, deadline - time.monotonic())))
        log(
            f"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={batch.get('step')}, "
            "OpType=ALLREDUCE) ran for longer than the timeout.",
            "TP0",
        )
        os.kill(os.getpid(), signal.SIGQUIT)
        threading.Event().wait()


class Follower:
    """A node ≥ 1: join node 0's rendezvous, then run each step node 0 sends on the local ranks."""

    def __init__(self, args: SimServerArgs) -> None:
        self.addr = _addr(args)
        self.node_rank = args.node_rank
        self.sock: socket.socket | None = None

    def join(self) -> bool:
        """Connect to node 0's rendezvous; False at the dist-init timeout."""
        deadline = time.monotonic() + _timeout("SGLANG_SIM_DIST_INIT_TIMEOUT_S", 60)
        while time.monotonic() < deadline:
            try:
                self.sock = socket.create_connection(self.addr, timeout=1.0)
            except OSError:
                time.sleep(0.2)
                continue
            self.sock.settimeout(None)
            self.sock.sendall(f"hello {self.node_rank}\n".encode())
            return True
        return False

    def serve(self, conns: list[Connection], leaders: list[Connection]) -> None:
        """Relay node 0's steps to the local ranks and answer when they are done (forever)."""
        assert self.sock is not None
        reader = self.sock.makefile("rb")
        while True:
            try:
                line = reader.readline(_LINE_MAX)
            except OSError:
                line = b""
            if not line:
                threading.Event().wait()  # node 0 is gone: our ranks wait in the collective, as NCCL's do
            batch = json.loads(line)
            for conn in conns:
                conn.send(batch)
            for leader in leaders:
                leader.recv()
            self.sock.sendall(b"done\n")


def rendezvous(launch: Launch) -> Hub | Follower:
    """Form the group (node 0 hosts, the others join); a failure ends the launch like SGLang's init error."""
    args = launch.args
    host, port = _addr(args)
    log(
        f"Init torch distributed begin. nnodes={args.nnodes}, node_rank={args.node_rank}, dist_init_addr={host}:{port}"
    )
    link: Hub | Follower = Hub(args) if args.node_rank == 0 else Follower(args)
    ok = link.rendezvous() if isinstance(link, Hub) else link.join()
    if not ok:
        waited = _timeout("SGLANG_SIM_DIST_INIT_TIMEOUT_S", 60)
        log(
            f"torch.distributed.DistStoreError: Timed out after {waited:g} seconds waiting for clients. "
            f"{len(link.peers) + 1 if isinstance(link, Hub) else 1}/{args.nnodes} clients joined."
        )
        kill_tree(include_parent=False, exit_code=1)
    log("Init torch distributed ends.")
    return link


async def serve_worker(launch: Launch, follower: Follower) -> None:
    """A node ≥ 1: relay steps, serve the dummy health server, die with a crashed rank, stop on SIGTERM."""
    args = launch.args
    threading.Thread(target=follower.serve, args=(launch.conns, launch.leaders), daemon=True).start()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    for path in ("/ping", "/health", "/health_generate"):
        app.router.add_get(path, ok)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port, reuse_address=True).start()
    uvicorn(f"Uvicorn running on {args.listen_url()} (Press CTRL+C to quit)")

    def stop() -> None:
        launch.marker.unlink(missing_ok=True)
        launch.publish_stopped()
        kill_tree(include_parent=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(signal.SIGQUIT, stop)
    await Crash(launch).subprocess_watchdog()
    await asyncio.Event().wait()
