"""Find a test's processes from outside, as an operator's `ps` and `fuser` would, and kill them."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil

from tests.support.wait import wait_for


def title(proc: psutil.Process) -> str:
    """The process title as `ps` shows it (setproctitle pads the cmdline)."""
    try:
        return " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return ""


def holders(*paths: Path) -> set[int]:
    """PIDs holding any of `paths` open, found by scanning /proc/*/fd as `fuser` does."""
    targets = {str(p) for p in paths}
    pids = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in targets for fd in fd_dir.iterdir()):
                pids.add(int(fd_dir.parent.name))
    return pids


def ours(state_dir: Path) -> list[psutil.Process]:
    """Every live process of one simulated host: its environment names the state dir, or it holds one of its GPUs.

    setproctitle overwrites the environment block of titled processes (as in SGLang), so the ranks are found
    by the device files they hold. The state dir is the test's own, so parallel tests never see each other's.
    """
    pids = holders(*sorted((state_dir / "dev").glob("nvidia*")))
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            mine = proc.pid in pids or proc.environ().get("SGLANG_SIM_STATE_DIR") == str(state_dir)
            if mine and proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def kill_all(state_dir: Path) -> None:
    """SIGKILL every process of the simulated host and wait until none is left."""
    for proc in ours(state_dir):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_for(lambda: not ours(state_dir), 10, f"every process of {state_dir} gone")


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process of the process group remains."""
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def kill_group(pgid: int) -> None:
    """SIGKILL a process group and wait until no live member is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: not group_alive(pgid), 10, f"process group {pgid} gone")
