"""`state_dir` on a full file system: supervision goes on (detect, reap, relaunch), the failures are logged."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import deployment

pytestmark = pytest.mark.hardening


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "512k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the block (skips the test where mounting is not permitted)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, timeout=30
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(directory: Path) -> None:
    """Write until the file system refuses (ENOSPC)."""
    with open(directory / "filler", "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()


def test_a_crash_is_recovered_while_state_dir_is_full(tmp_path: Path) -> None:
    """Disk full under state_dir: a crash is still detected and relaunched; journal/state failures are logged."""
    with small_tmpfs(tmp_path / "state") as state, deployment(tmp_path, tp=2) as dep:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", 90, "serving")
        fill(state)
        os.kill(int(first["pid"]), 9)
        again = dep.wait(lambda s: s["state"] == "serving" and s["pid"] != first["pid"], 120, "relaunched")
        assert again["last_incident"]["fault"] in ("crash", "startup_failure")
        log = dep.log_tail(100000)
        assert "journal.append_failed" in log or "state.save_failed" in log
        assert dep.daemon is not None and dep.daemon.poll() is None
