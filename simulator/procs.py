"""The main process's primitives that its launch and its teardown share: SGLang's kill_process_tree, and the
/dev/shm segments a run uses (and a crash leaves behind)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import NoReturn

import psutil

from simulator import gpus
from simulator.logs import log

SHM_PATTERNS = ("sgl_shm_*", "psm_*", "sem.mp-*")


def shm_dir() -> Path:
    """The stand-in for /dev/shm."""
    return Path(os.environ.get("SGLANG_SIM_SHM_DIR") or gpus.state_dir() / "shm")


def shm_used_mb() -> float:
    """Apparent size of SGLang's shared-memory files."""
    total = 0
    for pattern in SHM_PATTERNS:
        for path in shm_dir().glob(pattern):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
    return total / 2**20


def leak_shm(count: int = 40, size_mb: int = 2) -> None:
    """A crash that leaves `sgl_shm_mm_*` segments behind (sparse files)."""
    shm_dir().mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open(shm_dir() / f"sgl_shm_mm_{os.getpid()}_{i}", "wb") as fh:
            fh.truncate(size_mb * 2**20)


def kill_tree(include_parent: bool, exit_code: int = 0) -> NoReturn:
    """SGLang's kill_process_tree: SIGKILL every descendant still in the tree, then the parent."""
    me = psutil.Process()
    log(f"kill_process_tree called: parent_pid={me.pid}, include_parent={include_parent}, pid={me.pid}")
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    if include_parent:
        os.kill(me.pid, signal.SIGKILL)
    os._exit(exit_code)
