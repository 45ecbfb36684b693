"""RunIdentity: the same process still running, or why not (another boot, gone, PID reused, group changed)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.host.identity import RunIdentity, boot_id
from supervisor.host.proctree import start_ticks


def _me() -> RunIdentity:
    ident = RunIdentity.of(os.getpid())
    assert ident is not None
    return ident


def test_a_live_process_matches_its_recorded_identity() -> None:
    """The identity taken now matches; it survives JSON; the boot id is this boot's."""
    ident = _me()
    assert ident.matches_live() is None
    assert RunIdentity.from_json(ident.to_json()) == ident
    assert ident.boot_id == boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert ident.start_ticks == start_ticks(os.getpid())


def test_a_reused_pid_another_boot_and_another_group_are_told_apart() -> None:
    """Another start time at the PID is a reused PID; another boot id is another boot; a moved group is said."""
    ident = _me()
    assert dataclasses.replace(ident, start_ticks=ident.start_ticks + 1).matches_live() == (
        "pid reused (start time differs)"
    )
    assert dataclasses.replace(ident, boot_id="0" * 36).matches_live() == "boot id differs"
    assert dataclasses.replace(ident, pgid=ident.pgid + 1).matches_live() == "process group differs"


def test_an_exited_process_is_gone() -> None:
    """A PID whose process exited (and was reaped) no longer matches; RunIdentity.of it is None."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    pid = int(done.stdout)
    assert dataclasses.replace(_me(), pid=pid).matches_live() == "pid gone"
    assert RunIdentity.of(pid) is None


@pytest.mark.parametrize(
    "data",
    [{}, {"pid": "1", "pgid": 1, "start_ticks": 1, "boot_id": "b"}, {"pid": 1, "pgid": 1, "start_ticks": 1}],
)
def test_a_malformed_record_is_refused(data: dict[str, object]) -> None:
    """from_json raises ValueError on a missing or mistyped field rather than trusting it."""
    with pytest.raises(ValueError):
        RunIdentity.from_json(data)
