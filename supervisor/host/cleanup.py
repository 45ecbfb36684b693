"""Leftovers of a dead run besides processes: stale shared-memory files and bound ports."""

from __future__ import annotations

import errno
import fnmatch
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from supervisor.host import gpu, openfiles

SHM_PATTERNS = ("sgl_shm_*", "psm_*", "sem.mp-*")
_POLL_S = 0.05


@dataclass(frozen=True)
class PortsResult:
    """Outcome of ``wait_ports_free``: ok, or which ports are still bound and by whom if known."""

    ok: bool
    reason: str
    busy: tuple[int, ...]
    elapsed_s: float


def sweep_shm(
    shm_dir: Path,
    patterns: Sequence[str] = SHM_PATTERNS,
    owned_by_dead_run: Callable[[Path], bool] | None = None,
) -> list[Path]:
    """Remove files in ``shm_dir`` matching ``patterns`` that no live process has open or mapped.

    ``owned_by_dead_run`` narrows the sweep further (e.g. by owner or age); by default every unheld
    matching file is stale. Returns the paths removed.
    """
    try:
        candidates = sorted(
            p for p in Path(shm_dir).iterdir() if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)
        )
    except OSError:
        return []
    candidates = [
        p for p in candidates if p.is_file() and (owned_by_dead_run is None or owned_by_dead_run(p))
    ]
    if not candidates:
        return []
    held = openfiles.open_holders(candidates, include_maps=True)
    removed = []
    for path in candidates:
        if held[path]:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def busy_ports(host: str, ports: Sequence[int]) -> list[int]:
    """The ports of ``ports`` still in use on ``host`` (a bind with SO_REUSEADDR fails)."""
    return [port for port in ports if not _bindable(host, port)]


def wait_ports_free(host: str, ports: Sequence[int], deadline_s: float) -> PortsResult:
    """Poll until every port can be bound again, or report which are still held and by which PID."""
    start = time.monotonic()
    while True:
        busy = busy_ports(host, ports)
        elapsed = time.monotonic() - start
        if not busy:
            return PortsResult(True, "ports free", (), elapsed)
        if elapsed >= deadline_s:
            owners = ", ".join(f"{port} ({_port_owner(port)})" for port in busy)
            return PortsResult(
                False, f"ports still bound after {elapsed:.1f}s: {owners}", tuple(busy), elapsed
            )
        time.sleep(min(_POLL_S, max(0.0, deadline_s - elapsed)))


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def _port_owner(port: int) -> str:
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return "holder unknown"
    pids = sorted({c.pid for c in conns if c.laddr and c.laddr.port == port and c.pid is not None})
    if not pids:
        return "holder unknown"
    return "held by " + ", ".join(f"pid {pid} ({gpu.describe_owner(pid)})" for pid in pids)
