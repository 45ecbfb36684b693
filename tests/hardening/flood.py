"""A flood of the daemon's status endpoint, a busy process, and a fault timed from outside the endpoint.

`Flood`: `clients` HTTP/1.1 clients on loopback, each looping on `/metrics`, `/status` and `/incidents?limit=500`
(one in four opens a new connection per request, as a `curl` loop does); bounded in time and in requests, it stops
by itself. `Busy`: a process spinning one core for a bounded time (the same CPU taken away without the flood).
`kill_main`: SIGKILL the simulated server's main process and read the detection and serving-again times from the
daemon's journal file, so that a flooded endpoint does not slow the measurement itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from supervisor.records.incident import Incident
from tests.support.daemon import Deployment, toml_value
from tests.support.wait import wait_for

PATHS = ("/metrics", "/status", "/incidents?limit=500")
NO_BACKOFF: dict[str, float] = {"initial_s": 0, "jitter": 0, "restarts": 10000, "window_s": 600}
SEEDED = (
    500  # resolved incidents written to the journal before the daemon starts: /incidents?limit=500 is full
)


@dataclass
class FloodDeployment(Deployment):
    """A `Deployment` with `[supervisor.http]` settings of its own and a journal seeded with old incidents."""

    http: dict[str, Any] = field(default_factory=dict)

    def supervisor_lines(self) -> list[str]:
        lines = super().supervisor_lines()
        at = lines.index("[supervisor.restart]")
        return [*lines[:at], *(f"{k} = {toml_value(v)}" for k, v in self.http.items()), *lines[at:]]

    @property
    def journal_path(self) -> Path:
        return self.root / "state" / "incidents.jsonl"

    def seed_journal(self, n: int = SEEDED) -> None:
        """`n` resolved crash incidents of a day ago in the journal."""
        write_journal(self.journal_path, n, self.name)

    def incidents(self) -> dict[str, dict[str, Any]]:
        """The journal as the daemon wrote it: the latest line of each incident id."""
        found: dict[str, dict[str, Any]] = {}
        for line in self.journal_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                found[record["id"]] = record
        return found

    def main_pid(self) -> int | None:
        """The live simulated main process the daemon launched (None while there is none)."""
        assert self.daemon is not None
        for child in psutil.Process(self.daemon.pid).children():
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE and "simulator.launch_server" in child.cmdline():
                    return child.pid
        return None


def write_journal(path: Path, n: int, server: str) -> None:
    """A journal of `n` resolved crash incidents of `server`, a day old."""
    path.parent.mkdir(parents=True, exist_ok=True)
    day_ago = time.time() - 86400
    lines = []
    for i in range(n):
        incident = Incident(
            id=f"seed-{i:04d}",
            server=server,
            fault="crash",
            detected_at=day_ago + i,
            evidence={"exit_code": -9, "events": ["main_exited"], "note": "seeded " * 20},
            action="relaunch",
            reason="main process exited (-9)",
            argv_before=("python", "-m", "simulator.launch_server", "--tp-size", "2"),
            argv_after=("python", "-m", "simulator.launch_server", "--tp-size", "2"),
            recovered_at=day_ago + i + 5,
            detection_latency_s=0.1,
            time_to_serving_s=5.0,
        )
        lines.append(json.dumps(incident.to_json(), separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n")


def kill_main(dep: FloodDeployment, timeout: float = 120.0) -> tuple[float, float]:
    """SIGKILL the main process; (seconds to detection, seconds to serving again), from the journal."""
    pid = wait_for(dep.main_pid, timeout, "a simulated main process")
    known = set(dep.incidents())
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    def recovered() -> dict[str, Any] | None:
        fresh = [i for k, i in dep.incidents().items() if k not in known]
        return fresh[0] if fresh and fresh[0].get("recovered_at") else None

    incident = wait_for(recovered, timeout, f"serving again after SIGKILL of {pid}")
    assert incident["fault"] == "crash", incident
    return float(incident["detected_at"]) - killed_at, float(incident["recovered_at"]) - killed_at


@dataclass
class FloodStats:
    """What the flood's clients got."""

    responses: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    started: float = 0.0
    ended: float = 0.0

    @property
    def per_s(self) -> float:
        """Responses per second over the flood's life."""
        return self.responses / max(1e-9, (self.ended or time.monotonic()) - self.started)


class Flood:
    """`clients` looping clients of the endpoint at `host:port`, for at most `max_s` and `max_requests`."""

    def __init__(
        self, port: int, clients: int = 300, max_s: float = 120.0, max_requests: int = 2_000_000
    ) -> None:
        self.port, self.clients, self.max_s, self.max_requests = port, clients, max_s, max_requests
        self.stats = FloodStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Flood:
        self.stats.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def wait(self) -> FloodStats:
        """Wait until the flood ends by itself (its time or request budget spent)."""
        self._thread.join(timeout=self.max_s + 30)
        return self.stats

    def _done(self) -> bool:
        return self._stop.is_set() or self.stats.responses + self.stats.errors >= self.max_requests

    async def _main(self) -> None:
        tasks = [asyncio.create_task(self._client(i)) for i in range(self.clients)]
        deadline = self.stats.started + self.max_s
        while not self._done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the flood's own stop check, not a test's synchronisation
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.stats.ended = time.monotonic()

    async def _client(self, number: int) -> None:
        close = number % 4 == 0
        n = number
        while not self._done():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 10)
            except (OSError, TimeoutError):
                self.stats.errors += 1
                await asyncio.sleep(0.1)  # a refused client retries, as a scraper would
                continue
            try:
                while not self._done():
                    n += 1
                    if not await self._one(reader, writer, PATHS[n % len(PATHS)], close):
                        break
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                self.stats.errors += 1
            finally:
                writer.close()

    async def _one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, close: bool
    ) -> bool:
        """One GET; whether the connection stays open."""
        connection = "close" if close else "keep-alive"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: {connection}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 30)
        self.stats.responses += 1
        self.stats.by_status[status] = self.stats.by_status.get(status, 0) + 1
        return not close and headers.get("connection", "").lower() != "close"


class Busy:
    """A process spinning one core for at most `max_s` (killed on exit)."""

    def __init__(self, max_s: float = 120.0) -> None:
        self.code = (
            f"import time\nend = time.monotonic() + {max_s}\nwhile time.monotonic() < end:\n    pass\n"
        )

    def __enter__(self) -> Busy:
        self.proc = subprocess.Popen([sys.executable, "-c", self.code])
        try:
            ps = psutil.Process(self.proc.pid)
            wait_for(lambda: sum(ps.cpu_times()[:2]) > 0.2, 30, "the busy process spinning")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def flood_deployment(root: Path, **kw: Any) -> Iterator[FloodDeployment]:
    """A `FloodDeployment` with a seeded journal, always cleaned up."""
    dep = FloodDeployment(root, **kw)
    try:
        dep.seed_journal()
        yield dep
    finally:
        dep.cleanup()
