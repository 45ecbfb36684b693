"""Before a launch: can the server's command run at all, and is its port held by someone else?

`command_problems` is a config error for `check-config` and `run` (a missing or non-executable program never
becomes a crash loop), and so is `container_problem`: a container client as the command (`docker run …`) would
make the supervisor own the client, not the container. An interpreter that exists but lacks the module it is
asked to run passes here; the flag check (`flaghelp`) then notes that the flags were not checked. `port_holders` names who listens on a
port the server needs, before the launch rather than after a failed start and a release wait.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from supervisor.host.cleanup import busy_ports
from supervisor.host.proctree import RUN_MARKER, display_name, read_markers

if TYPE_CHECKING:
    from supervisor.config import Config, ServerConfig

LOOPBACK = "127.0.0.1"
# Programs that start or reach a container through a daemon or an API: killing one leaves its container running.
CONTAINER_CLIENTS = frozenset(
    {"docker", "podman", "podman-remote", "nerdctl", "kubectl", "crictl", "ctr"}
    | {"docker-compose", "podman-compose"}
)
CONTAINER_RUNBOOK = "runbook.md#running-in-a-container"


def container_client(command: Sequence[str]) -> str | None:
    """The container client `command` runs (`docker`, `docker compose`, `kubectl`…), or None."""
    name = Path(command[0]).name if command else ""
    if name not in CONTAINER_CLIENTS:
        return None
    return f"{name} compose" if list(command[1:2]) == ["compose"] else name


def container_problem(command: Sequence[str]) -> str | None:
    """Why a container client cannot be a server's command, or None when `command` is not one."""
    client = container_client(command)
    if client is None:
        return None
    return (
        f"the server's own program, not a container client: the supervisor would own the {client} process, "
        "not the container, and killing it leaves the container on the GPUs; run the supervisor inside the "
        f"container instead ({CONTAINER_RUNBOOK})"
    )


def command_problem(command: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """Why `command[0]` cannot be executed (missing, a directory, not executable), or None when it can.

    A bare name is looked up on the PATH the child will get (the server's `env` PATH, else the daemon's).
    """
    if not command or not command[0]:
        return "empty command"
    program = command[0]
    if os.sep not in program:
        path = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
        return None if shutil.which(program, path=path) else f"{program!r} not found on PATH"
    target = Path(program)
    if not target.exists():
        return f"{program} does not exist"
    if not target.is_file():
        return f"{program} is not a file"
    if not os.access(target, os.X_OK):
        return f"{program} is not executable"
    return None


def command_problems(config: Config) -> list[str]:
    """One line per server whose command cannot run (`servers[i].command: why`)."""
    out: list[str] = []
    for i, server in enumerate(config.servers):
        why = command_problem(server.command, server.env)
        if why:
            out.append(f"servers[{i}].command ({server.name}): {why}")
    return out


@dataclass(frozen=True)
class PortHolder:
    """A port the server needs that something already listens on."""

    port: int
    pid: int | None  # None when the owner is not visible to us (another user's process)
    name: str
    ours: bool  # carries a run marker of this daemon: a leftover to reap, not a foreign process

    def describe(self) -> str:
        """One line for the status: `port 30000 held by pid 4242 (nginx)`."""
        who = f"pid {self.pid} ({self.name})" if self.pid is not None else "a process we cannot see"
        return f"port {self.port} held by {who}" + (" of a previous run" if self.ours else "")


def port_addresses(cfg: ServerConfig) -> dict[str, list[int]]:
    """Where the server binds the ports it owns, address → ports: its HTTP port at its `--host` (a wildcard as
    itself: the launch needs the port free on every address), its extra `ports` at loopback (their address is
    not configured; a loopback bind also meets a holder of the wildcard)."""
    out = {cfg.bind_host: [cfg.http_port]}
    extra = sorted(set(cfg.ports) - {cfg.http_port})
    if extra:
        out.setdefault(LOOPBACK, []).extend(extra)
    return out


def port_holders(ports: Sequence[int], host: str = LOOPBACK) -> list[PortHolder]:
    """Who holds each of `ports` bound at `host` (only ports that cannot be bound there are listed)."""
    busy = busy_ports(host, list(dict.fromkeys(ports)))
    if not busy:
        return []
    listeners: dict[int, int | None] = {}
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in busy:
                listeners.setdefault(conn.laddr.port, conn.pid)
    holders: list[PortHolder] = []
    for port in busy:
        pid = listeners.get(port)
        if pid is None:
            holders.append(PortHolder(port, None, "unknown", False))
            continue
        holders.append(PortHolder(port, pid, display_name(pid), RUN_MARKER in read_markers(pid)))
    return holders


def foreign_port_holders(cfg: ServerConfig) -> list[PortHolder]:
    """Holders of the server's HTTP and extra ports, where it binds them, that are not processes of ours."""
    held = [h for host, ports in port_addresses(cfg).items() for h in port_holders(ports, host)]
    return [h for h in held if not h.ours]
