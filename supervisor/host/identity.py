"""Prove that a process found alive is the very one a run started: boot id, PID, process group, start time.

A PID alone names a process only until it exits: the kernel hands the number out again, and after a reboot every
number starts over. ``(boot id, PID, start time in clock ticks since boot)`` names one process for good, so a run
records it at launch (``RunIdentity.of``) and a daemon that finds the run later checks it (``matches_live``) before
it trusts, signals or adopts anything at that PID.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.host.proctree import start_ticks

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@functools.cache
def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): it changes at every boot, never in between."""
    return _BOOT_ID.read_text().strip()


@dataclass(frozen=True)
class RunIdentity:
    """The main process of a run as recorded when it started."""

    pid: int
    pgid: int
    start_ticks: int
    boot_id: str

    @classmethod
    def of(cls, pid: int) -> RunIdentity | None:
        """The identity of the live process ``pid`` now; None if it is gone (or a zombie)."""
        ticks = start_ticks(pid)
        try:
            pgid = os.getpgid(pid)
        except OSError:
            return None
        return None if ticks is None else cls(pid, pgid, ticks, boot_id())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_json`` reads it back)."""
        return {"pid": self.pid, "pgid": self.pgid, "start_ticks": self.start_ticks, "boot_id": self.boot_id}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunIdentity:
        """Read what ``to_json`` wrote; ValueError if a field is missing or of the wrong type."""
        ints = {k: data.get(k) for k in ("pid", "pgid", "start_ticks")}
        bad = [k for k, v in ints.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0]
        boot = data.get("boot_id")
        if bad or not isinstance(boot, str) or not boot:
            raise ValueError(f"not a run identity: {dict(data)!r}")
        return cls(data["pid"], data["pgid"], data["start_ticks"], boot)

    def matches_live(self) -> str | None:
        """None when this very process still runs; otherwise why not: "boot id differs", "pid gone",
        "pid reused (start time differs)" or "process group differs"."""
        if boot_id() != self.boot_id:
            return "boot id differs"
        ticks = start_ticks(self.pid)
        if ticks is None:
            return "pid gone"
        if ticks != self.start_ticks:
            return "pid reused (start time differs)"
        try:
            pgid = os.getpgid(self.pid)
        except OSError:
            return "pid gone"
        return None if pgid == self.pgid else "process group differs"
