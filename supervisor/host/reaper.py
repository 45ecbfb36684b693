"""Stop one run and reap everything of it: group, descendants, marked orphans, holders of its devices.

``drain``: SIGTERM to the main PID only (SGLang's schedulers have no SIGTERM handler, so a group SIGTERM
would skip the drain), poll until it is gone or ``grace_s`` passes, then SIGKILL the group.
``kill``: SIGKILL the group at once (a wedged server cannot drain).
Then sweep until ``deadline_s``: the group, descendants seen before, every process whose environment
carries the run marker (re-parented to PID 1 or in its own session), and our holders of the device paths.
Processes that are not ours are never signalled; the ones holding our devices are reported.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from supervisor.host import gpu, proctree
from supervisor.host.proctree import DEFAULT_ALLOWLIST, ProcId

_POLL_S = 0.05


@dataclass(frozen=True)
class Killed:
    """A process that is gone, and the route that reached it (term, group, descendant, marker, device)."""

    pid: int
    name: str
    route: str


@dataclass(frozen=True)
class StopResult:
    """What ``stop`` did: ok, or the reason naming the PID that would not die and its state."""

    ok: bool
    reason: str
    mode: str
    killed: tuple[Killed, ...]
    foreign_holders: tuple[gpu.Holder, ...]
    term_s: float | None
    total_s: float


class _Sweep:
    def __init__(
        self,
        pgid: int | None,
        run_id: str,
        server: str | None,
        allowlist: Sequence[str],
        known: Iterable[ProcId],
    ) -> None:
        self.pgid = pgid
        self.run_id = run_id
        self.server = server
        self.allowlist = allowlist
        self.known = list(known)
        self.killed: dict[int, Killed] = {}
        self.group_spared = False
        self.group_ok = self._group_is_ours()

    def is_ours(self, pid: int) -> bool:
        markers = proctree.read_markers(pid)
        if markers.get(proctree.RUN_MARKER) == self.run_id:
            return True
        return self.server is not None and markers.get(proctree.SERVER_MARKER) == self.server

    def targets(self, device_paths: Sequence[Path]) -> tuple[dict[int, str], list[gpu.Holder]]:
        found: dict[int, str] = {}
        if self.group_ok and self.pgid is not None:
            found.update((pid, "group") for pid in proctree.group_members(self.pgid))
        for ident in self.known:
            if proctree.still_same(ident):
                found.setdefault(ident.pid, "descendant")
        for ident in proctree.find_marked(self.run_id):
            found.setdefault(ident.pid, "marker")
        if self.server is not None:
            for ident in proctree.find_marked(server=self.server):
                found.setdefault(ident.pid, "marker")
        foreign = []
        if device_paths:
            for holder in gpu.device_holders(device_paths, use_fuser=False, allowlist=self.allowlist):
                if holder.pid in found or self.is_ours(holder.pid):
                    found.setdefault(holder.pid, "device")
                else:
                    foreign.append(holder)
        spared = {pid for pid in found if proctree.is_protected(pid, self.allowlist)}
        self.group_spared = any(found[pid] == "group" for pid in spared)
        return {pid: route for pid, route in found.items() if pid not in spared}, foreign

    def kill(self, found: dict[int, str]) -> list[int]:
        """SIGKILL the group (if ours) and every target still alive; return those still alive."""
        alive = [pid for pid in found if proctree.is_alive(pid)]
        group_alive = any(found[p] == "group" for p in alive)
        if self.group_ok and self.pgid is not None and group_alive and not self.group_spared:
            _signal_group(self.pgid)
        for pid in alive:
            self.killed.setdefault(pid, Killed(pid, proctree.display_name(pid), found[pid]))
            _signal(pid, signal.SIGKILL)
        return alive

    def _group_is_ours(self) -> bool:
        if self.pgid is None or self.pgid <= 1 or self.pgid == os.getpgrp():
            return False
        return any(self.is_ours(pid) for pid in proctree.group_members(self.pgid))


def stop(
    main_pid: int | None,
    pgid: int | None,
    run_id: str,
    mode: str = "kill",
    grace_s: float = 10.0,
    deadline_s: float = 10.0,
    allowlist: Sequence[str] = DEFAULT_ALLOWLIST,
    device_paths: Sequence[Path] = (),
    known: Iterable[ProcId] = (),
    server: str | None = None,
) -> StopResult:
    """Stop the run and poll until every process of it is gone; never signals what is not ours.

    ``main_pid`` and ``pgid`` are trusted only if a process carries this run's marker (PIDs from a previous
    daemon may have been reused). ``known``: descendants seen alive in the last tree snapshot, checked
    against their start time. ``server``: also reap any run of that server (a previous daemon's).
    The sweep has ``deadline_s`` after the drain grace.
    """
    start = time.monotonic()
    if mode not in ("drain", "kill"):
        return StopResult(False, f"unknown stop mode {mode!r}; allowed: drain, kill", mode, (), (), None, 0.0)
    sweep = _Sweep(pgid, run_id, server, allowlist, known)
    term_s = None
    if main_pid is not None and proctree.is_alive(main_pid) and sweep.is_ours(main_pid):
        sweep.known += proctree.descendants(main_pid)
        if mode == "drain":
            term_s = _drain(main_pid, grace_s, sweep)
    deadline = time.monotonic() + deadline_s
    foreign: list[gpu.Holder] = []
    full_scan = True
    while True:
        found, holders = sweep.targets(device_paths if full_scan else ())
        foreign = holders if full_scan else foreign
        alive = sweep.kill(found)
        if not alive and full_scan:
            break
        full_scan = not alive
        if alive and time.monotonic() >= deadline:
            break
        if alive:
            time.sleep(_POLL_S)
    total = time.monotonic() - start
    killed = tuple(sweep.killed.values())
    stuck = [pid for pid in alive if proctree.is_alive(pid)]
    if stuck:
        names = "; ".join(f"pid {pid} ({proctree.display_name(pid)}) state {_state(pid)}" for pid in stuck)
        reason = f"still alive after {total:.1f}s despite SIGKILL: {names}"
        return StopResult(False, reason, mode, killed, tuple(foreign), term_s, total)
    reason = f"stopped {len(killed)} process(es) in {total:.2f}s"
    if foreign:
        reason += f"; {len(foreign)} foreign holder(s) of our devices left alone"
    return StopResult(True, reason, mode, killed, tuple(foreign), term_s, total)


def _drain(main: int, grace_s: float, sweep: _Sweep) -> float | None:
    """SIGTERM the main PID only; the seconds it took to exit, or None if it outlived the grace."""
    start = time.monotonic()
    name = proctree.display_name(main)
    _signal(main, signal.SIGTERM)
    while time.monotonic() - start < grace_s:
        if not proctree.is_alive(main):
            sweep.killed[main] = Killed(main, name, "term")
            return time.monotonic() - start
        time.sleep(_POLL_S / 2)
    return None


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


def _signal_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _state(pid: int) -> str:
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return "gone"
