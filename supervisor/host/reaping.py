"""Every process that ends under the daemon is reaped by it, spawned or re-parented.

On a host the daemon makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a rank orphaned when its
SGLang main dies re-parents to the daemon instead of to PID 1, so the daemon reaps it and logs its exit status
(``process.reaped``). A reaped process is gone: release, the one-tree check and adoption never see a zombie as a
live process (``proctree.is_alive`` excludes zombies anyway).

The daemon's own spawns are waited for by their owners: a server's main process by its ``Popen`` (polled by
the loop, which may be seconds later), a helper (``fuser``, ``py-spy``, a target's ``--help``) by the code that
started it, at once. So a zombie child is reaped here only when it is not claimed (``claim``: the launcher's
main processes) and has stayed a zombie for ``grace_s``, long past any owner's own wait: an exit status is
never taken from the code that waits for it.

If the daemon dies, its orphans re-parent to the next subreaper above it (systemd, or the container's init,
``supervisor.pid1``), which reaps them; a daemon that adopts a tree afterwards sees the exit of a main process
through its pidfd, but not its status (``launcher.EXIT_UNKNOWN``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger()

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
GRACE_S = 1.0

_claims: set[int] = set()
_lock = threading.Lock()


def become_subreaper() -> bool:
    """Make this process a child subreaper; False (and logged) where the kernel refuses it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("daemon.subreaper_refused", error=os.strerror(ctypes.get_errno()))
        return False
    return True


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    flag = ctypes.c_int(0)
    return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0


def claim(pid: int) -> None:
    """``pid`` (a child of ours) is waited for by its owner: never reap it here."""
    with _lock:
        _claims.add(pid)


def unclaim(pid: int) -> None:
    """Its owner has reaped ``pid`` (or given it up)."""
    with _lock:
        _claims.discard(pid)


@dataclass(frozen=True)
class Reaped:
    """A child reaped here: its PID, its name as the kernel kept it, and its status (negative: the signal)."""

    pid: int
    name: str
    status: int


def zombie_children(proc: str = "/proc") -> dict[int, str]:
    """This process's children that have exited and wait to be reaped: PID → name."""
    me = os.getpid()
    found: dict[int, str] = {}
    for pid in _children(proc, me):
        stat = _stat(proc, pid)
        if stat is not None and stat[1] == "Z" and stat[2] == me:
            found[pid] = stat[0]
    return found


def _children(proc: str, me: int) -> set[int]:
    pids: set[int] = set()
    try:
        tasks = os.listdir(f"{proc}/{me}/task")
        for tid in tasks:
            with open(f"{proc}/{me}/task/{tid}/children") as fh:
                pids.update(int(p) for p in fh.read().split())
        return pids
    except (OSError, ValueError):  # a kernel without CONFIG_PROC_CHILDREN: every PID's parent, read
        return {int(p) for p in os.listdir(proc) if p.isdigit()}


def _stat(proc: str, pid: int) -> tuple[str, str, int] | None:
    """(name, state letter, parent PID) from /proc/PID/stat; None once it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return head.partition("(")[2], fields[0], int(fields[1])


class OrphanReaper:
    """Reaps this process's unclaimed zombie children once each has waited ``grace_s``; logs each status."""

    def __init__(self, grace_s: float = GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self.clock = clock
        self.reaped_total = 0
        self._first_seen: dict[int, float] = {}

    def reap_pass(self) -> bool:
        """One pass (``reap``); True while zombies remain that were left for their grace or their owner."""
        self.reap()
        return bool(self._first_seen)

    def reap(self, grace_s: float | None = None) -> list[Reaped]:
        """One pass: every zombie child that nobody claimed and that has waited long enough (``grace_s``: this
        once instead of the reaper's own; 0 when the daemon exits and nothing of it waits any more), reaped."""
        grace = self.grace_s if grace_s is None else grace_s
        now = self.clock()
        zombies = zombie_children()
        self._first_seen = {pid: self._first_seen.get(pid, now) for pid in zombies}
        done: list[Reaped] = []
        for pid, name in zombies.items():
            if now - self._first_seen[pid] < grace:
                continue
            with _lock:
                if pid in _claims:
                    continue
                status = _wait(pid)
            if status is not None:
                self._first_seen.pop(pid, None)
                done.append(Reaped(pid, name, status))
                log.info("process.reaped", pid=pid, name=name, status=status, hint=_hint(status))
        self.reaped_total += len(done)
        return done


def _wait(pid: int) -> int | None:
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def _hint(status: int) -> str:
    return f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
