"""Launch one server in its own session with its output in a log file the daemon follows, or attach to one running.

The child gets ``CUDA_VISIBLE_DEVICES`` for its GPUs and the run marker (``SGLSUP_RUN_ID``, ``SGLSUP_SERVER``) that
``proctree`` and ``reaper`` use to find everything of this run later. Its stdout and stderr are the log file
itself, opened ``O_WRONLY|O_APPEND|O_CREAT``: no pipe to the daemon, so the tree's output never depends on the
daemon being alive (a pipe whose reader died loses lines with EPIPE, or freezes the server once a non-reading
holder's 64 KiB fill up). A reader thread in the daemon follows the file (``runlog.LogTail``: lines of at most
16 KiB in a ``deque(maxlen=ring_lines)``, the catalogued lines a flood pushes out kept aside, size-bounded
rotation, so a log flood costs at most about ``rotate_bytes * (rotate_keep + 1)`` of disk and a fixed amount of
memory). ``log_offset`` is where a successor starts: ``attach`` follows a server this daemon did not start (an
earlier daemon did) from that offset, and watches its exit through a pidfd.

``SPT_NOENV=1`` is set too: without it ``setproctitle`` (which SGLang uses to title its ranks) reuses the
environment block for the title, and ``/proc/<pid>/environ`` of every rank loses the run marker.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from supervisor.host import proctree, reaping
from supervisor.host.proctree import RUN_MARKER, SERVER_MARKER
from supervisor.host.runlog import LINE_LIMIT, TRUNCATED, LogTail

__all__ = ["EXIT_UNKNOWN", "LINE_LIMIT", "TRUNCATED", "Launched", "MiB", "SpawnFailed", "attach", "spawn"]

MiB = 1024 * 1024
# The returncode of an attached process that has exited but was not our child: its exit status went to its
# parent and is lost to us. 256 is no status a process can have (exit codes are 0-255, signals negative), so it
# is never mistaken for a real one; 255 would be (``exit(-1)``).
EXIT_UNKNOWN = 256


@dataclass(frozen=True)
class SpawnFailed:
    """The process could not be started or attached (missing executable, unusable log, process gone)."""

    reason: str
    ok: bool = False


class _Child:
    """The exit of a process this daemon started: ``Popen`` reaps it and knows its status."""

    exit_known = True

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def poll(self) -> int | None:
        code = self._proc.poll()
        if code is not None:
            reaping.unclaim(self._proc.pid)
        return code


class _Found:
    """The exit of a process found running, through a pidfd (immune to PID reuse). If it is our child (the daemon
    re-executed itself in place) ``waitid`` reaps it and gives its status; otherwise only its end is seen, and
    its status is ``EXIT_UNKNOWN``."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd
        self._code: int | None = None
        self._lock = threading.Lock()
        self.exit_known = True
        self.poll()

    def poll(self) -> int | None:
        with self._lock:
            if self._pidfd is None:
                return self._code
            if self.exit_known:
                try:
                    done = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
                except ChildProcessError:
                    self.exit_known = False
                else:
                    if done is not None:
                        code = done.si_status
                        self._end(code if done.si_code == os.CLD_EXITED else -code)
                    return self._code
            watch = select.poll()
            watch.register(self._pidfd, select.POLLIN)
            if watch.poll(0):
                self._end(EXIT_UNKNOWN)
            return self._code

    def _end(self, code: int) -> None:
        assert self._pidfd is not None
        os.close(self._pidfd)
        self._pidfd, self._code = None, code
        reaping.unclaim(self.pid)


class Launched:
    """A running server process: PID, process group, captured output, exit status."""

    ok = True
    reason = "started"

    def __init__(
        self,
        pid: int,
        pgid: int,
        status: _Child | _Found,
        exit_fd: int,
        log_fd: int,
        log_path: Path,
        offset: int,
        ring_lines: int,
        rotate_bytes: int,
        rotate_keep: int,
    ) -> None:
        self.pid = pid
        self.pgid = pgid
        self.started_at = time.monotonic()  # for an attached process: when it was attached
        self.log_path = log_path
        self._status = status
        self._log = LogTail(
            log_fd, log_path, offset, ring_lines, rotate_bytes, rotate_keep, self._exited, exit_fd
        )

    def tail(self, n: int) -> list[str]:
        """The last ``n`` captured lines (fewer if the ring holds fewer)."""
        return self._log.tail(n)

    def lines_since(self, cursor: int) -> tuple[list[str], int]:
        """Lines captured after ``cursor`` (start with 0): those still in the ring, preceded by the catalogued
        lines (errors, warnings, startup progress) of any stretch that a flood pushed out of it; and the next
        cursor."""
        return self._log.lines_since(cursor)

    @property
    def unscanned_lines(self) -> int:
        """Lines of floods of unique lines too fast to classify (they are still in the log file)."""
        return self._log.unscanned_lines

    @property
    def exit_known(self) -> bool:
        """False for an attached process that is not our child: its exit is seen, its status is not."""
        return self._status.exit_known

    @property
    def log_error(self) -> str | None:
        """Why rotating or reading the log file failed, if it did (the lines read so far stay available)."""
        return self._log.error

    def returncode(self) -> int | None:
        """Exit status (negative = killed by that signal), or None while it runs; ``EXIT_UNKNOWN`` once an
        attached process that was not our child has exited. Reaps the process when it is our child."""
        return self._status.poll()

    def log_offset(self) -> int:
        """The byte offset in the log file just after the last whole line captured: where ``attach`` resumes.
        Read after ``close`` it is exact (no line lost or repeated). A rotation moves it back (the head of the
        file is cut off), so a value saved before a rotation points too far: save it again after reading."""
        return self._log.offset()

    def output_ended(self) -> bool:
        """The main process has exited and the log file has been read to its end since: every line it wrote is
        captured (a process of the tree that outlives it may still add some). Asking wakes the reader, so the
        answer turns True within a moment of the exit."""
        if self._log.ended():
            return True
        self._log.wake()
        return False

    def close(self, timeout_s: float = 2.0) -> bool:
        """Read what the log file holds now, then stop following it; True if the reader thread ended within the
        timeout. The server is not touched: its output keeps going to the file."""
        return self._log.close(timeout_s)

    def _exited(self) -> bool:
        return self._status.poll() is not None


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    gpus: Sequence[int],
    run_id: str,
    server: str,
    log_path: Path,
    ring_lines: int = 2000,
    rotate_bytes: int = 50 * MiB,
    rotate_keep: int = 3,
) -> Launched | SpawnFailed:
    """Start ``argv`` in a new session with the run marker; never raises for a bad argv or log path."""
    if not argv:
        return SpawnFailed("empty argv")
    full_env = {
        **os.environ,
        "SPT_NOENV": "1",
        **env,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        RUN_MARKER: run_id,
        SERVER_MARKER: server,
    }
    path = Path(log_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        return SpawnFailed(f"cannot open log {log_path}: {exc}")
    try:
        log_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        os.close(out)
        return SpawnFailed(f"cannot read log {log_path}: {exc}")
    offset = os.fstat(log_fd).st_size  # an earlier run's lines are not this one's
    try:
        proc = subprocess.Popen(
            list(argv),
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        os.close(log_fd)
        return SpawnFailed(f"cannot start {argv[0]!r}: {exc}")
    finally:
        os.close(out)
    reaping.claim(proc.pid)
    try:
        pgid = os.getpgid(proc.pid)
    except OSError:
        pgid = proc.pid
    exit_fd = os.pidfd_open(proc.pid)  # our child, not reaped yet: the PID is still its own
    return Launched(
        proc.pid, pgid, _Child(proc), exit_fd, log_fd, path, offset, ring_lines, rotate_bytes, rotate_keep
    )


def attach(
    pid: int,
    pgid: int,
    log_path: Path,
    offset: int,
    ring_lines: int = 2000,
    rotate_bytes: int = 50 * MiB,
    rotate_keep: int = 3,
    start_ticks: int | None = None,
) -> Launched | SpawnFailed:
    """Follow a server running already (started by an earlier daemon): its log file from ``offset`` (a saved
    ``log_offset``; from 0 if the file is shorter now), its exit through a pidfd. Given ``start_ticks`` (its
    ``RunIdentity``), the PID is checked to still be that process once the pidfd holds it, so a reused PID is
    never followed. Never raises: a process gone or a log unreadable is a ``SpawnFailed``."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return SpawnFailed(f"pid {pid} is gone")
    except OSError as exc:
        return SpawnFailed(f"cannot watch pid {pid}: {exc}")
    ticks = proctree.start_ticks(pid)
    if ticks is None or (start_ticks is not None and ticks != start_ticks):
        os.close(pidfd)
        return SpawnFailed(f"pid {pid} has exited" if ticks is None else f"pid {pid} is another process now")
    path = Path(log_path)
    try:
        log_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        os.close(pidfd)
        return SpawnFailed(f"cannot read log {log_path}: {exc}")
    reaping.claim(pid)  # our child after a re-exec in place: its status is _Found's to take
    exit_fd = os.dup(pidfd)  # the reader's own: _Found closes its pidfd once it saw the exit
    return Launched(
        pid, pgid, _Found(pid, pidfd), exit_fd, log_fd, path, offset, ring_lines, rotate_bytes, rotate_keep
    )
