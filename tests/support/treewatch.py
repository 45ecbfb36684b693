"""The supervisor's invariants watched from outside, as `ps` and `fuser` would see them, for every deployment a
test runs: two runs of one server never live at once, and nothing of any run is left after the daemon stops.

A process belongs to a server's run by its own environment markers (`SGLSUP_SERVER`, `SGLSUP_RUN_ID`), else by
its nearest ancestor's (a rank that retitled itself may have overwritten its environment block), else — an
orphan with no readable marker — by the server's GPU device files it holds (its run then unknown: a run of its
own). Only processes whose command line names SGLang or the simulator are read, so a scan stays cheap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.host.proctree import RUN_MARKER, SERVER_MARKER, server_marker

PERIOD_S = 0.1
STOP_TIMEOUT_S = 120.0  # a graceful stop drains every server (drain_grace_s) and verifies the release
VIOLATIONS: list[str] = []  # what cleanups found, for the per-test check in tests/conftest.py
CANDIDATE_WORDS = (b"sglang", b"simulator", b"launch_server", b"launch_router")


@dataclass(frozen=True)
class Seen:
    """One live process of a watched server, and the run it belongs to."""

    pid: int
    server: str
    run: str
    title: str


def _read(path: str, limit: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return b""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) from /proc/<pid>/stat."""
    raw = _read(f"/proc/{pid}/stat", 4096)
    _, sep, rest = raw.rpartition(b")")
    fields = rest.split()
    if not sep or len(fields) < 2:
        return None
    return fields[0].decode(), int(fields[1])


def _markers(pid: int) -> tuple[str, str] | None:
    env = dict(entry.split(b"=", 1) for entry in _read(f"/proc/{pid}/environ").split(b"\0") if b"=" in entry)
    server, run = env.get(SERVER_MARKER.encode()), env.get(RUN_MARKER.encode())
    return (server.decode(errors="replace"), run.decode(errors="replace")) if server and run else None


def _held(pid: int) -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def scan(markers: Mapping[str, str], devices: Mapping[str, Sequence[Path]]) -> list[Seen]:
    """The live (non-zombie) processes of the watched servers: `markers` maps SGLSUP_SERVER → server name,
    `devices` server name → its GPU device files."""
    by_device = {str(p): name for name, paths in devices.items() for p in paths}
    procs: dict[int, tuple[int, tuple[str, str] | None, str]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        cmdline = _read(f"/proc/{pid}/cmdline", 4096)
        if not any(word in cmdline for word in CANDIDATE_WORDS):
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        procs[pid] = (stat[1], _markers(pid), cmdline.replace(b"\0", b" ").decode(errors="replace")[:80])
    seen = []
    for pid, (ppid, own, title) in procs.items():
        found, hops, cursor = own, 0, ppid
        while found is None and cursor in procs and hops < 8:
            found, cursor, hops = procs[cursor][1], procs[cursor][0], hops + 1
        if found is not None and found[0] in markers:
            seen.append(Seen(pid, markers[found[0]], found[1], title))
            continue
        if found is None:  # an orphan whose environment is unreadable: one "unmarked" run per server
            for path in _held(pid) & by_device.keys():
                seen.append(Seen(pid, by_device[path], "unmarked", title))
                break
    return seen


class TreeWatch:
    """A background thread that scans the watched servers and remembers every instant two runs lived at once."""

    def __init__(self, names: Sequence[str], state_dir: Path, devices: Mapping[str, Sequence[Path]]) -> None:
        self.markers = {server_marker(name, state_dir): name for name in names}
        self.devices = devices
        self.overlaps: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="treewatch", daemon=True)
        self._thread.start()

    def now(self) -> list[Seen]:
        """The watched servers' live processes at this instant."""
        return scan(self.markers, self.devices)

    def _run(self) -> None:
        suspect: dict[str, frozenset[str]] = {}
        while not self._stop.wait(PERIOD_S):
            runs: dict[str, set[str]] = {}
            seen = self.now()
            for s in seen:
                runs.setdefault(s.server, set()).add(s.run)
            current = {name: frozenset(r) for name, r in runs.items() if len(r) > 1}
            for name, both in current.items():
                # a scan is not atomic: two scans in a row must agree before two runs count as coexisting
                if suspect.get(name) == both:
                    what = ", ".join(f"{s.pid} {s.title!r} (run {s.run})" for s in seen if s.server == name)
                    self.overlaps.append(f"{time.strftime('%H:%M:%S')} server {name}: {what}")
            suspect = current

    def close(self) -> None:
        """Stop watching."""
        self._stop.set()
        self._thread.join(timeout=5)

    def check_one_tree(self) -> None:
        """Fail if two runs of one server were ever seen alive together."""
        if self.overlaps:
            raise AssertionError("two runs of one server lived at once:\n" + "\n".join(self.overlaps[:10]))

    def check_nothing_left(self, timeout_s: float = 5.0) -> None:
        """After the daemon stopped: no process of any run of the watched servers is alive (a dying one gets
        `timeout_s` to finish)."""
        deadline = time.monotonic() + timeout_s
        left = self.now()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.now()
        if left:
            what = "\n".join(f"{s.pid} {s.title!r} of {s.server} (run {s.run})" for s in left)
            raise AssertionError(f"left after the daemon stopped:\n{what}")


def stop_and_check(daemon: subprocess.Popen[bytes] | None, watch: TreeWatch) -> list[str]:
    """Stop the daemon as systemd does (SIGTERM) and return what broke the invariants: two runs at once, or
    anything left after a graceful stop (a daemon the test killed is not asked)."""
    problems: list[str] = []
    try:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                problems.append(f"the daemon did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM")
        checks = [watch.check_one_tree]
        if daemon is not None and daemon.poll() == 0:
            checks.append(watch.check_nothing_left)
        for check in checks:
            try:
                check()
            except AssertionError as exc:
                problems.append(str(exc))
    finally:
        watch.close()
    return problems
