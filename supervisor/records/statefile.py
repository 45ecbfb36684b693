"""`state_dir/state.json`: who runs, with which flags and ladder levels; survives daemon restarts."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from policies.argv import redact as redact_argv
from supervisor.redaction import hide

log = structlog.get_logger()


@dataclass
class ServerRecord:
    """What the daemon must remember about one server across its own restarts."""

    run_id: str = ""
    pid: int | None = None
    pgid: int | None = None
    argv: list[str] = field(default_factory=list)  # shown, never relaunched from: saved with keys masked
    levels: dict[str, int] = field(default_factory=dict)  # ladder key -> active rung
    history: list[list[Any]] = field(default_factory=list)  # [ladder key, rung] of past incidents
    state: str = "stopped"
    group_generation: int = 0  # the group generation this server last launched (multi-node groups)
    open_incident: str = ""  # the incident a recovery is under way for ("" once serving again)
    # what a later daemon needs to adopt the run (supervisor.loop.adoption)
    identity: dict[str, Any] = field(
        default_factory=dict
    )  # pid, pgid, start ticks, boot id of the main process
    spec: str = ""  # policies.spec.spec_hash of what was launched
    log_path: str = ""  # the file the run writes its output to
    log_offset: int = 0  # how far the daemon had read it (exact after a handover)
    detached: bool = False  # a handover left the run to the next daemon on purpose


@dataclass
class StateFile:
    """The whole file: the daemon that wrote it and one record per server."""

    path: Path
    daemon_pid: int = 0
    servers: dict[str, ServerRecord] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> StateFile:
        """Read the file; a missing one is an empty state. An unreadable, truncated or corrupt one is logged
        (`state.unreadable`), kept aside as `state.json.corrupt`, and is an empty state too: the trees of earlier
        runs are still found by their environment marker and reaped before any launch."""
        state = cls(path)
        try:
            data = json.loads(path.read_text())
            state.daemon_pid = int(data.get("daemon_pid", 0))
            for name, rec in dict(data.get("servers", {})).items():
                known = {k: v for k, v in dict(rec).items() if k in ServerRecord.__dataclass_fields__}
                state.servers[str(name)] = ServerRecord(**known)
        except FileNotFoundError:
            return state
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            aside = path.with_name(path.name + ".corrupt")
            try:
                os.replace(path, aside)
            except OSError:
                aside = path
            log.error(
                "state.unreadable",
                path=str(path),
                kept_as=str(aside),
                error=f"{type(exc).__name__}: {exc}"[:200],
                fallback="empty state; earlier runs are reaped by their environment marker",
            )
            return cls(path)
        return state

    def record(self, name: str) -> ServerRecord:
        """The record of a server (created empty)."""
        return self.servers.setdefault(name, ServerRecord())

    def save(self) -> None:
        """Write atomically (tmp + fsync + rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        servers = {k: {**asdict(v), "argv": redact_argv(v.argv)} for k, v in self.servers.items()}
        data = hide({"daemon_pid": os.getpid(), "servers": servers})  # argv is for display: no key in it
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
