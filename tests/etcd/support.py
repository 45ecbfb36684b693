"""Helpers for the etcd tier: a real etcd (Debian's `etcd-server`, extracted by tests/support/tools.py) on loopback, and a cuttable TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.daemon import Deployment, q
from tests.support.ports import free_port
from tests.support.tools import ensure_etcd

START_TIMEOUT_S = 30.0


class EtcdServer:
    """One single-member etcd on 127.0.0.1 with a temp data dir; `stop()` and `start()` keep the data."""

    def __init__(self, workdir: Path) -> None:
        self.binary = ensure_etcd()
        self.workdir = workdir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL (the JSON gateway answers on it)."""
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start etcd and wait until it answers `/health`."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            str(self.binary),
            "--name=test",
            f"--data-dir={self.workdir / 'data'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--log-level=warn",
        ]
        with (self.workdir / "etcd.log").open("ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / "etcd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"etcd did not become healthy:\n{tail}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                return b'"true"' in resp.read(4096)
        except OSError:
            return False

    def stop(self) -> None:
        """Stop etcd (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of etcd; `cut()` drops every connection and refuses new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.open = True
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """The URL to give a client instead of etcd's."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on a free port."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while self.open and (chunk := await reader.read(65536)):
                writer.write(chunk)
                await writer.drain()
        writer.close()
        self._writers.discard(writer)

    def cut(self) -> None:
        """Partition: close every open connection and refuse new ones."""
        self.open = False
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def heal(self) -> None:
        """End the partition."""
        self.open = True

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class ThreadedProxy:
    """A `Proxy` running on its own event loop thread, for tests that drive daemons synchronously."""

    def __init__(self, target_port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxy = Proxy(target_port)
        self.thread = threading.Thread(target=self.loop.run_forever, name="etcd-proxy", daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(timeout=10)

    @property
    def url(self) -> str:
        """The URL to give a daemon instead of etcd's."""
        return self.proxy.url

    def cut(self) -> None:
        """Partition the daemons behind this proxy from etcd."""
        self.loop.call_soon_threadsafe(self.proxy.cut)

    def heal(self) -> None:
        """End the partition."""
        self.loop.call_soon_threadsafe(self.proxy.heal)

    def close(self) -> None:
        """Stop the proxy and its thread."""
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def group_section(server: str, rank: int, etcd_url: str, lease_ttl_s: float, barrier_timeout_s: float) -> str:
    """The `[group]` tables of node `rank` of the 2-node group "g" whose member is `server`."""
    lines = [
        "[group]",
        'name = "g"',
        f"server = {q(server)}",
        f"node_rank = {rank}",
        "nnodes = 2",
        f"lease_ttl_s = {lease_ttl_s}",
        f"barrier_timeout_s = {barrier_timeout_s}",
        "[group.etcd]",
        f"endpoints = [{q(etcd_url)}]",
        "timeout_s = 2",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class GroupDeployment(Deployment):
    """A daemon whose one server is node `rank` of group "g": tp 16 over 2 nodes, 8 ranks and 8 GPUs on each."""

    rank: int = 0
    etcd_url: str = ""
    dist_addr: str = ""
    barrier_timeout_s: float = 60.0

    def write(self) -> None:
        """The deployment's config plus the multi-node flags and the [group] section."""
        self.tp, self.local_gpus = 16, 8
        self.extra_args = [
            "--nnodes", "2", "--node-rank", str(self.rank), "--dist-init-addr", self.dist_addr,
        ]  # fmt: skip
        self.env = {**self.env, "SGLANG_SIM_DIST_INIT_TIMEOUT_S": "20"}
        if self.rank > 0:
            self.probes = {**self.probes, "canary_mode": "off", "stream_canary_period_s": 0}
        self.restart = {"initial_s": 0.2, "max_s": 1.0, **self.restart}
        super().write()
        with self.config_path.open("a") as fh:
            fh.write(
                group_section(
                    self.name,
                    self.rank,
                    self.etcd_url,
                    lease_ttl_s=2,
                    barrier_timeout_s=self.barrier_timeout_s,
                )
            )

    def group(self) -> dict[str, Any]:
        """The `group` block of /status."""
        return dict(self.status()["group"])
