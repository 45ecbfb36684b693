"""Cleanup: stale shared-memory files swept unless held, ports held then freed."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.host import cleanup


def test_sweep_shm_removes_stale_and_keeps_held(tmp_path: Path, start_holder: Callable[..., int]) -> None:
    """Unheld sgl_shm_*/psm_*/sem.mp-* files go; open, mapped and unmatched files stay."""
    shm = tmp_path / "shm"
    shm.mkdir()
    for name in ("sgl_shm_a", "psm_b", "sem.mp-c", "sgl_shm_held", "sem.mp-mapped", "other.txt"):
        (shm / name).write_bytes(b"\0" * 4096)
    start_holder(shm / "sgl_shm_held")
    start_holder(shm / "sem.mp-mapped", "--mmap")
    removed = cleanup.sweep_shm(shm)
    assert sorted(p.name for p in removed) == ["psm_b", "sem.mp-c", "sgl_shm_a"]
    assert sorted(p.name for p in shm.iterdir()) == ["other.txt", "sem.mp-mapped", "sgl_shm_held"]


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_live_semaphore_is_not_swept() -> None:
    """Regression: a multiprocessing semaphore is mapped under glibc's temporary name, shown "(deleted)"; the
    sweep matched mappings by name, removed the live ``sem.mp-*`` of another process and its spawned child
    then failed to start (FileNotFoundError in SemLock._rebuild)."""
    ctx = multiprocessing.get_context("spawn")
    lock = ctx.Lock()
    sem = Path("/dev/shm") / ("sem." + lock._semlock.name.lstrip("/"))  # type: ignore[attr-defined]
    assert sem.exists()
    removed = cleanup.sweep_shm(Path("/dev/shm"), owned_by_dead_run=lambda p: p == sem)
    assert removed == [] and sem.exists()
    child = ctx.Process(target=_acquire_and_release, args=(lock,))
    child.start()
    child.join(60)
    assert child.exitcode == 0


def _acquire_and_release(lock: multiprocessing.synchronize.Lock) -> None:
    with lock:
        pass


def test_ports_held_then_freed() -> None:
    """A listening port is reported bound, with its holder at the deadline, and free once closed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        assert cleanup.busy_ports("127.0.0.1", [port]) == [port]
        held = cleanup.wait_ports_free("127.0.0.1", [port], deadline_s=0.1)
        assert not held.ok and held.busy == (port,) and str(port) in held.reason
    finally:
        listener.close()
    freed = cleanup.wait_ports_free("127.0.0.1", [port], deadline_s=10)
    assert freed.ok, freed.reason
