"""Launch one server in its own session, with its output in a rotating log file and a bounded ring.

The child gets ``CUDA_VISIBLE_DEVICES`` for its GPUs and the run marker (``SGLSUP_RUN_ID``,
``SGLSUP_SERVER``) that ``proctree`` and ``reaper`` use to find everything of this run later.
stdout and stderr are merged into one pipe; a reader thread splits it into lines (each at most 16 KiB),
appends them to the log file (size-based rotation, N kept) and to a ``deque(maxlen=ring_lines)``, so a
log flood costs disk up to ``rotate_bytes * (rotate_keep + 1)`` and a fixed amount of memory. Whole lines are
handled in bulk (tens of MB/s, so the server never blocks on its stdout), and the catalogued lines a flood
pushes out of the ring before the monitor reads it are kept aside (``lognotice``).

``SPT_NOENV=1`` is set too: without it ``setproctitle`` (which SGLang uses to title its ranks) reuses the
environment block for the title, and ``/proc/<pid>/environ`` of every rank loses the run marker.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from supervisor.host.lognotice import NotableLines
from supervisor.host.proctree import RUN_MARKER, SERVER_MARKER

MiB = 1024 * 1024
LINE_LIMIT = 16 * 1024
TRUNCATED = " …[truncated]"
_READ_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class SpawnFailed:
    """The process could not be started (missing executable, unwritable log, empty argv)."""

    reason: str
    ok: bool = False


class _RotatingLog:
    """Append-only file that rotates to ``.1`` … ``.keep`` once it would exceed ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.error: str | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - lives as long as the process
        self._size = path.stat().st_size

    def write(self, data: bytes) -> None:
        if self._fh is None:
            return
        try:
            if self._size and self._size + len(data) > self.max_bytes:
                self._rotate()
            self._fh.write(data)
            self._size += len(data)
        except OSError as exc:
            self._fail(exc)

    def flush(self) -> None:
        if self._fh is None:
            return
        try:
            self._fh.flush()
        except OSError as exc:
            self._fail(exc)

    def close(self) -> None:
        if self._fh is not None:
            self.flush()
            if self._fh is not None:
                self._fh.close()
            self._fh = None

    def _rotate(self) -> None:
        assert self._fh is not None
        self._fh.close()
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.keep > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._fh = open(self.path, "wb")  # noqa: SIM115 - replaces the handle closed above
        self._size = 0

    def _fail(self, exc: OSError) -> None:
        self.error = f"log {self.path} disabled: {exc}"
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                return


class Launched:
    """A running server process: PID, process group, captured output, exit status."""

    ok = True
    reason = "started"

    def __init__(self, proc: subprocess.Popen[bytes], log: _RotatingLog, ring_lines: int) -> None:
        self.pid = proc.pid
        try:
            self.pgid = os.getpgid(proc.pid)
        except OSError:
            self.pgid = proc.pid
        self.started_at = time.monotonic()
        self.log_path = log.path
        self._proc = proc
        self._log = log
        self._ring: deque[bytes] = deque(maxlen=ring_lines)
        self._notable = NotableLines()
        self._count = 0
        self._lock = threading.Lock()
        self._ended = threading.Event()
        # close() wakes the reader through this pipe: it sleeps in select until output or the wake comes
        self._wake_r, wake_w = os.pipe()
        self._wake_w: int | None = wake_w
        self._wake_lock = threading.Lock()
        self._pending = bytearray()
        self._discarding = False
        self._thread = threading.Thread(target=self._pump, name=f"log-{proc.pid}", daemon=True)
        self._thread.start()

    def tail(self, n: int) -> list[str]:
        """The last ``n`` captured lines (fewer if the ring holds fewer)."""
        with self._lock:
            raw = list(self._ring)[-n:] if n > 0 else []
        return [_text(line) for line in raw]

    def lines_since(self, cursor: int) -> tuple[list[str], int]:
        """Lines captured after ``cursor`` (start with 0): those still in the ring, preceded by the catalogued
        lines (errors, warnings, startup progress) of any stretch that a flood pushed out of it; and the next
        cursor."""
        with self._lock:
            first = self._count - len(self._ring)
            start = max(cursor, first) - first
            raw = self._notable.between(cursor, first) + list(self._ring)[start:]
            count = self._count
        return [_text(line) for line in raw], count

    @property
    def unscanned_lines(self) -> int:
        """Lines of floods of unique lines too fast to classify (they are still in the log file)."""
        return self._notable.unscanned_lines

    def returncode(self) -> int | None:
        """Exit status (negative = killed by that signal), or None while it runs. Reaps the process."""
        return self._proc.poll()

    def output_ended(self) -> bool:
        """Every process of the tree closed the output (end of file): no line is still on its way."""
        return self._ended.is_set()

    def close(self, timeout_s: float = 2.0) -> bool:
        """Stop reading output and close the log; True if the reader thread ended within the timeout."""
        with self._wake_lock:
            if self._wake_w is not None:
                os.write(self._wake_w, b"\0")
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _pump(self) -> None:
        stream = self._proc.stdout
        assert stream is not None
        fd = stream.fileno()
        try:
            while True:
                ready, _, _ = select.select([fd, self._wake_r], [], [])
                if fd not in ready:
                    break  # close() woke it with nothing left to read
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    break
                self._feed(chunk)
                self._log.flush()
            if self._pending and not self._discarding:
                self._emit(bytes(self._pending))
        finally:
            self._log.close()
            stream.close()
            with self._wake_lock:
                assert self._wake_w is not None
                os.close(self._wake_w)
                self._wake_w = None
            os.close(self._wake_r)
            self._ended.set()

    def _feed(self, chunk: bytes) -> None:
        """Whole lines of a chunk in bulk (one write, one ring extend); over-long lines one by one."""
        self._pending += chunk
        end = self._pending.rfind(b"\n")
        if end < 0:
            self._overflow()
            return
        block = bytes(self._pending[: end + 1])
        del self._pending[: end + 1]
        lines = block[:-1].split(b"\n")
        if self._discarding:  # the rest of an over-long line already emitted cut
            self._discarding = False
            block = block[len(lines[0]) + 1 :]
            lines = lines[1:]
        if lines and max(map(len, lines)) <= LINE_LIMIT:
            self._log.write(block)
            self._notable.scan(block, lines, self._count)
            with self._lock:
                self._ring.extend(lines)
                self._count += len(lines)
        else:
            for line in lines:
                self._emit(line)
        self._overflow()

    def _overflow(self) -> None:
        if len(self._pending) > LINE_LIMIT:
            if not self._discarding:
                self._emit(bytes(self._pending))
            self._discarding = True
            self._pending.clear()

    def _emit(self, raw: bytes | bytearray) -> None:
        line = bytes(raw[:LINE_LIMIT]) + (TRUNCATED.encode() if len(raw) > LINE_LIMIT else b"")
        self._log.write(line + b"\n")
        self._notable.scan(line, [line], self._count)
        with self._lock:
            self._ring.append(line)
            self._count += 1


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")


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
    try:
        log = _RotatingLog(Path(log_path), rotate_bytes, rotate_keep)
    except OSError as exc:
        return SpawnFailed(f"cannot open log {log_path}: {exc}")
    try:
        proc = subprocess.Popen(
            list(argv),
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        log.close()
        return SpawnFailed(f"cannot start {argv[0]!r}: {exc}")
    return Launched(proc, log, ring_lines)
