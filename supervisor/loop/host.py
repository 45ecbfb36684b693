"""The host boundary of the server loop: every effect it has on processes, GPUs, files and HTTP goes through here.

`RealHost` does the work (launcher, proctree, release, forensics, the target's `--help`, the probes' monitor);
unit tests pass a fake with the same methods, so the loop's every transition runs in microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from policies.flagcompat import FlagSet
from policies.model import Observation, ProbeSettings, TreeView
from probes.monitor import Monitor
from probes.pd_pair import PdPair
from supervisor.config import ServerConfig, SupervisorConfig
from supervisor.host import aborts, adopt, forensics, identity, launcher, preflight, proctree
from supervisor.host.adopt import AdoptionView
from supervisor.host.flaghelp import HelpUnavailable, target_flags
from supervisor.host.gpu import GpuBackend, device_holders
from supervisor.host.launcher import SpawnFailed
from supervisor.host.proctree import ProcId, TreeEvent, TreeSnapshot
from supervisor.host.release import ReleaseReport, stop_and_release
from supervisor.loop.clock import Clock
from supervisor.records.incident import Incident


class RunHandle(Protocol):
    """One launched tree: its main PID and group, its captured output, its exit status."""

    @property
    def pid(self) -> int: ...

    @property
    def pgid(self) -> int: ...

    def tail(self, n: int) -> list[str]: ...

    def lines_since(self, cursor: int) -> tuple[list[str], int]: ...

    def returncode(self) -> int | None: ...

    def output_ended(self) -> bool: ...

    def close(self, timeout_s: float = 2.0) -> bool: ...

    def log_offset(self) -> int: ...


class ProbeMonitor(Protocol):
    """What the loop needs of the probes of one server (`probes.monitor.Monitor`)."""

    async def tick(self, now: float) -> list[Observation]: ...

    def window(self) -> list[Observation]: ...

    def latest(self, probe: str) -> Observation | None: ...

    def next_due(self) -> float: ...

    @property
    def ready(self) -> asyncio.Event: ...

    def reset(self, now: float) -> None: ...

    def reconfigure(self, settings: ProbeSettings) -> None: ...

    def note_abort(self, now: float, rids: Sequence[str] = ()) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class MonitorSpec:
    """Where and how to probe one launch, and the loop's readers of what the host shows."""

    server: str
    role: str
    base_url: str
    pd_pair: Callable[[], PdPair | None] | None  # a PD worker's: the pair its canaries go through
    model: str
    settings: ProbeSettings
    tree: Callable[[], TreeView]
    gpu: Callable[[], list[dict[str, Any]]] | None
    log_lines: Callable[[], list[str]]
    pids_for_stacks: Callable[[], dict[int, str]]
    xids_seen: set[tuple[int, int, float]] = field(default_factory=set)  # Xid events reported, over launches


class Host(Protocol):
    """Every effect of the server loop."""

    async def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        gpus: Sequence[int],
        run_id: str,
        marker: str,
        log_path: Path,
    ) -> RunHandle | SpawnFailed: ...

    async def poll_tree(
        self, previous: TreeSnapshot | None, main_pid: int, run_id: str, titles: Sequence[str]
    ) -> tuple[TreeSnapshot, list[TreeEvent]]: ...

    async def find_marked(self, marker: str) -> list[ProcId]: ...

    async def earlier_run(self, marker: str, cfg: ServerConfig) -> list[str]: ...

    async def identity(self, run: RunHandle) -> dict[str, Any]: ...

    async def attach(
        self, identity: dict[str, Any], marker: str, run_id: str, log_path: str, offset: int | None
    ) -> RunHandle | str: ...

    async def adoption_view(
        self, cfg: ServerConfig, pid: int, run_id: str, marker: str, titles: list[str]
    ) -> AdoptionView: ...

    async def wait_exit(
        self, pids: Sequence[int], timeout: float, clock: Clock, wake: asyncio.Event | None = None
    ) -> None: ...

    async def foreign_port_holders(self, cfg: ServerConfig) -> list[str]: ...

    async def release(
        self,
        cfg: ServerConfig,
        sup: SupervisorConfig,
        *,
        main_pid: int | None,
        pgid: int | None,
        run_id: str,
        mode: str,
        known: list[ProcId],
        any_run_of: str | None = None,
    ) -> ReleaseReport: ...

    def gpu_reader(self, gpus: Sequence[int]) -> Callable[[], list[dict[str, Any]]] | None: ...

    async def forensics(
        self, sup: SupervisorConfig, evidence: forensics.Evidence, incident: Incident
    ) -> str: ...

    async def learn_flags(self, command: Sequence[str], cache: Path) -> FlagSet | HelpUnavailable: ...

    def monitor(self, spec: MonitorSpec) -> ProbeMonitor: ...

    async def abort_requests(
        self, base_url: str, api_key: str | None, timeout_s: float, rids: Sequence[str] = ()
    ) -> str: ...


class RealHost:
    """The host for real: subprocesses, /proc, the GPU backend, py-spy, HTTP probes."""

    def __init__(self, backend: GpuBackend, gpu_enabled: bool = True) -> None:
        self.backend = backend
        self.gpu_enabled = gpu_enabled
        # pidfds stay registered with the event loop from the first wait on a pid until it exits (registering
        # and unregistering on every tick cost more than the rest of the tick)
        self._pidfds: dict[int, int] = {}
        self._exit_waiters: dict[int, set[asyncio.Future[None]]] = {}

    async def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        gpus: Sequence[int],
        run_id: str,
        marker: str,
        log_path: Path,
    ) -> RunHandle | SpawnFailed:
        """Start the tree in a new session (launcher.spawn, in a thread)."""
        return await asyncio.to_thread(launcher.spawn, list(argv), env, list(gpus), run_id, marker, log_path)

    async def poll_tree(
        self, previous: TreeSnapshot | None, main_pid: int, run_id: str, titles: Sequence[str]
    ) -> tuple[TreeSnapshot, list[TreeEvent]]:
        """Snapshot the tree and what changed: from the known PIDs inline, else a full scan in a thread."""
        quick = proctree.quick_snapshot(main_pid, titles, previous)
        if quick is not None:
            return quick, []  # every known rank and the main process still run: nothing changed
        return await asyncio.to_thread(proctree.poll_tree, previous, main_pid, run_id, list(titles))

    async def wait_exit(
        self, pids: Sequence[int], timeout: float, clock: Clock, wake: asyncio.Event | None = None
    ) -> None:
        """Sleep `timeout`, but wake as soon as one of `pids` exits (pidfds: a crash is seen at once, not at the
        next tick) or `wake` is set. A pid already gone returns at once; where pidfds are unavailable only `wake`
        ends the sleep early."""
        if wake is not None and wake.is_set():
            return
        woke: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        watched: list[int] = []

        def done(_: object) -> None:
            if not woke.done():
                woke.set_result(None)

        waiter = asyncio.ensure_future(wake.wait()) if wake is not None else None
        if waiter is not None:
            waiter.add_done_callback(done)
        try:
            for pid in pids:
                registered = self._watch_pid(pid)
                if registered is None:
                    return  # already gone
                if registered:
                    self._exit_waiters.setdefault(pid, set()).add(woke)
                    watched.append(pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woke, timeout)
        finally:
            if waiter is not None:
                waiter.cancel()
            for pid in watched:
                self._exit_waiters.get(pid, set()).discard(woke)

    def _watch_pid(self, pid: int) -> bool | None:
        """A pidfd for `pid` registered with the event loop (True), pidfds unavailable (False), or gone (None)."""
        if pid in self._pidfds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError:
            return False
        self._pidfds[pid] = fd
        asyncio.get_running_loop().add_reader(fd, self._exited, pid)
        return True

    def _exited(self, pid: int) -> None:
        """`pid` exited: wake whoever waits on it, and forget its pidfd."""
        fd = self._pidfds.pop(pid)
        asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)
        for woke in self._exit_waiters.pop(pid, set()):
            if not woke.done():
                woke.set_result(None)

    async def find_marked(self, marker: str) -> list[ProcId]:
        """Processes carrying this server's marker (an earlier run's leftovers)."""
        return await asyncio.to_thread(proctree.find_marked, None, marker)

    async def earlier_run(self, marker: str, cfg: ServerConfig) -> list[str]:
        """Live processes of any run of this server (its marker) and every holder of its GPUs, described: a
        rank that retitled itself may no longer show its environment, but it still holds its GPU."""
        return await asyncio.to_thread(_earlier_run, marker, cfg)

    async def identity(self, run: RunHandle) -> dict[str, Any]:
        """What proves later that a process is still this run's main process (boot id, pid, start time)."""
        found = await asyncio.to_thread(identity.RunIdentity.of, run.pid)
        return found.to_json() if found is not None else {}

    async def attach(
        self, identity: dict[str, Any], marker: str, run_id: str, log_path: str, offset: int | None
    ) -> RunHandle | str:
        """Re-attach to a previous daemon's run (supervisor.host.adopt), or why it is not that run."""
        return await asyncio.to_thread(adopt.attach, identity, marker, run_id, log_path, offset)

    async def adoption_view(
        self, cfg: ServerConfig, pid: int, run_id: str, marker: str, titles: list[str]
    ) -> AdoptionView:
        """Ranks, GPU holders and `/server_info` of a found run (supervisor.host.adopt)."""
        return await asyncio.to_thread(adopt.view, cfg, pid, run_id, marker, titles)

    async def foreign_port_holders(self, cfg: ServerConfig) -> list[str]:
        """Processes that are not ours holding the server's ports, described for the status."""
        held = await asyncio.to_thread(preflight.foreign_port_holders, cfg)
        return [h.describe() for h in held]

    async def release(
        self,
        cfg: ServerConfig,
        sup: SupervisorConfig,
        *,
        main_pid: int | None,
        pgid: int | None,
        run_id: str,
        mode: str,
        known: list[ProcId],
        any_run_of: str | None = None,
    ) -> ReleaseReport:
        """Stop, reap, release the GPUs and verify them free (supervisor.host.release)."""
        return await stop_and_release(
            cfg,
            sup,
            self.backend,
            main_pid=main_pid,
            pgid=pgid,
            run_id=run_id,
            mode=mode,
            known=known,
            any_run_of=any_run_of,
        )

    def gpu_reader(self, gpus: Sequence[int]) -> Callable[[], list[dict[str, Any]]] | None:
        """A reader of the owned GPUs' samples, or None when GPU reading is off."""
        if not self.gpu_enabled:
            return None
        owned = list(gpus)
        return lambda: [s.to_json() for s in self.backend.snapshot(owned)]

    async def forensics(self, sup: SupervisorConfig, evidence: forensics.Evidence, incident: Incident) -> str:
        """The forensics bundle of an incident (its path, '' when none could be written)."""
        return await forensics.capture(sup, evidence, incident)

    async def learn_flags(self, command: Sequence[str], cache: Path) -> FlagSet | HelpUnavailable:
        """The flags the target accepts, from its own `--help` (cached)."""
        return await asyncio.to_thread(target_flags, list(command), cache)

    def monitor(self, spec: MonitorSpec) -> ProbeMonitor:
        """The probes of one server."""
        return Monitor(
            server=spec.server,
            role=spec.role,
            base_url=spec.base_url,
            pd_pair=spec.pd_pair,
            model=spec.model,
            settings=spec.settings,
            tree=spec.tree,
            gpu=spec.gpu,
            log_lines=spec.log_lines,
            pids_for_stacks=spec.pids_for_stacks,
            xids_seen=spec.xids_seen,
        )

    async def abort_requests(
        self, base_url: str, api_key: str | None, timeout_s: float, rids: Sequence[str] = ()
    ) -> str:
        """Abort the requests `rids` of a running server, or every request without them ('' when SGLang took
        it, else why not)."""
        if rids:
            return await aborts.abort_rids(base_url, api_key, timeout_s, rids)
        return await aborts.abort_all(base_url, api_key, timeout_s)


def _earlier_run(marker: str, cfg: ServerConfig) -> list[str]:
    found = {
        p.pid: f"pid {p.pid} ({proctree.display_name(p.pid)})" for p in proctree.find_marked(None, marker)
    }
    for holder in device_holders(cfg.device_paths, use_fuser=False):
        found.setdefault(holder.pid, f"pid {holder.pid} ({holder.name}, {holder.whose}) holds {holder.path}")
    return [found[pid] for pid in sorted(found)]
