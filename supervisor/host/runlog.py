"""Follow a server's log file: whole lines into a bounded ring, catalogued lines kept aside, the file size-bounded.

The server writes its stdout and stderr straight into the log file (the launcher opens it ``O_APPEND``), so its
output never depends on the daemon: with no reader at all it still never blocks and loses nothing. A reader thread
(``LogTail``) follows the file from a byte offset: it reads in bulk (at most 1 MiB at a time) while there is data
and, when there is none, sleeps ``POLL_S``, woken at once by ``close``, ``wake`` or the process's exit (a pidfd).
The bytes become lines (each at most 16 KiB, cut with a marker), kept in a ``deque(maxlen=ring_lines)``; the
catalogued lines a flood pushes out of the ring before the monitor reads it are kept aside (``lognotice``).
``offset`` is where the next reader starts: a daemon that persists it can hand the file over to its successor
without losing or repeating a line.

Rotation, done by the reader once the file holds more than ``rotate_bytes``: the head it has consumed (whole
lines, rounded down to a filesystem block, at most ``rotate_bytes``) is copied to ``.1`` (older copies shifted,
``.keep`` the last) and then cut off the file in place: ``fallocate`` punches it out (its pages are dropped, never
written to disk) and collapses the range, moving the rest of the file down. The server keeps appending meanwhile
and nothing is lost: ``.keep`` … ``.1`` and the file, concatenated, are its output in order (a line may straddle
two files). Where the filesystem cannot collapse (tmpfs, btrfs, NFS) the fallback is copy-and-truncate: the reader
reads to the end, copies the newest ``rotate_bytes`` to ``.1`` and truncates the file to 0; whatever the server
writes between that last read and the truncate (a copy's duration) is lost.

A flood faster than the reader (more than ``rotate_bytes / 2`` unread, and at least ``LAG_FLOOR``: a burst is read
in full, only a sustained flood is not): the reader jumps to the newest ``rotate_bytes / 8`` and reads on from
there; the lines jumped over (their number estimated from the density of lines where it lands) are counted, as
unscanned, and stay in the file. While it floods, a rotation cuts off all the consumed head and copies its newest
``rotate_bytes`` to ``.1`` at most once per ``FLOOD_COPY_S``: copying every cut would cost more than the flood.
The disk holds at most ``rotate_bytes * (rotate_keep + 1)`` (the rotated copies at most ``rotate_bytes`` each),
plus, during a flood, what is still unread (``LAG_FLOOR`` or half the file) and what the server writes while the
reader goes round once.
"""

from __future__ import annotations

import ctypes
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from supervisor.host.lognotice import NotableLines

LINE_LIMIT = 16 * 1024
TRUNCATED = " …[truncated]"
POLL_S = 0.05
_READ_CHUNK = 1024 * 1024
_PROBE = 64 * 1024
LAG_FLOOR = 16 * 1024 * 1024
FLOOD_COPY_S = 1.0
_PUNCH_HOLE = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
_COLLAPSE_RANGE = 0x08  # FALLOC_FL_COLLAPSE_RANGE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_libc.fallocate.restype = ctypes.c_int


def _fallocate(fd: int, mode: int, length: int) -> None:
    """``fallocate(fd, mode, 0, length)``: on the first ``length`` bytes (a multiple of the block size)."""
    if _libc.fallocate(fd, mode, 0, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class LogTail:
    """The reader of one log file: ring, notable lines, line count, consumed offset, rotation."""

    def __init__(
        self,
        fd: int,
        path: Path,
        offset: int,
        ring_lines: int,
        rotate_bytes: int,
        rotate_keep: int,
        exited: Callable[[], bool],
        exit_fd: int,
    ) -> None:
        """Follow the file open (read-write) at ``fd`` from ``offset`` (from 0 if the file is shorter now: it
        was rotated since); ``exited`` says whether the process whose output it is has exited, ``exit_fd`` (a
        pidfd of it, which the reader owns) wakes the reader the moment it does."""
        self.path = path
        self.error: str | None = None
        self._fd = fd
        self._offset = offset if 0 <= offset <= os.fstat(fd).st_size else 0  # the reader thread's own
        self._done = self._offset  # after the last whole line in the ring: what ``offset()`` tells
        self._rotate_bytes = max(rotate_bytes, 1)
        self._keep = max(rotate_keep, 0)
        self._lag_limit = max(self._rotate_bytes // 2, LAG_FLOOR)
        self._block = os.fstatvfs(fd).f_bsize
        self._collapse_ok = True
        self._flooding = False  # skipped since the reader last reached the end of the file
        self._copied_at = -FLOOD_COPY_S
        self._exited = exited
        self._ring: deque[bytes] = deque(maxlen=ring_lines)
        self._notable = NotableLines()
        self._count = 0
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._discarding = False
        self._stopping = False
        self._exit_fd = exit_fd
        self._wake_fd: int | None = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._poller = select.poll()
        self._poller.register(self._wake_fd, select.POLLIN)
        self._poller.register(exit_fd, select.POLLIN)
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"log-{path.name}", daemon=True)
        self._thread.start()

    def tail(self, n: int) -> list[str]:
        """The last ``n`` lines read (fewer if the ring holds fewer)."""
        with self._lock:
            raw = list(self._ring)[-n:] if n > 0 else []
        return [_text(line) for line in raw]

    def lines_since(self, cursor: int) -> tuple[list[str], int]:
        """Lines read after ``cursor`` (start with 0): those still in the ring, preceded by the catalogued lines
        (errors, warnings, startup progress) of any stretch that a flood pushed out of it; and the next cursor."""
        with self._lock:
            first = self._count - len(self._ring)
            start = max(cursor, first) - first
            raw = self._notable.between(cursor, first) + list(self._ring)[start:]
            count = self._count
        return [_text(line) for line in raw], count

    @property
    def unscanned_lines(self) -> int:
        """Lines of floods too fast to classify (they are still in the log files)."""
        return self._notable.unscanned_lines

    def offset(self) -> int:
        """The byte offset in the file just after the last whole line read: where a successor starts reading."""
        with self._lock:
            return self._done

    def wake(self) -> None:
        """Make the reader look at the file (and at the process) now rather than at its next poll."""
        with self._wake_lock:
            if self._wake_fd is not None:
                os.eventfd_write(self._wake_fd, 1)

    def ended(self) -> bool:
        """The process had exited when a pass over the file began, and that pass reached the end of the file
        (or the reader stopped): every line it wrote has been read."""
        return self._ended.is_set()

    def close(self, timeout_s: float) -> bool:
        """Read what the file holds now, then stop; True if the reader thread ended within the timeout."""
        self._stopping = True
        self.wake()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while True:
                self._drain_wakes()
                closing = self._stopping
                exited = self._exited()  # sampled first: this pass then reads all that the process wrote
                self._pass(closing)
                if exited and not self._ended.is_set():
                    if self._pending and not self._discarding:
                        self._emit(bytes(self._pending))
                    self._restart(self._offset)
                    self._ended.set()
                    self._poller.unregister(self._exit_fd)  # readable from now on: no longer a wake-up
                if closing:
                    return
                self._poller.poll(POLL_S * 1000)
        except OSError as exc:
            self.error = f"reading {self.path} stopped: {exc}"
        finally:
            os.close(self._fd)
            os.close(self._exit_fd)
            with self._wake_lock:
                assert self._wake_fd is not None
                os.close(self._wake_fd)
                self._wake_fd = None
            self._ended.set()

    def _drain_wakes(self) -> None:
        assert self._wake_fd is not None
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            return

    def _pass(self, closing: bool) -> None:
        """Read to the end of the file, rotating and skipping on the way; when closing, only what is there now."""
        budget = max(os.fstat(self._fd).st_size - self._offset, 0) if closing else -1
        while closing or not self._stopping:
            size = os.fstat(self._fd).st_size
            if size < self._offset:  # truncated by another hand: what is there is new
                self._restart(0)
            unread = size - self._offset
            if unread <= 0:
                self._flooding = False
            if (
                budget
                and unread > self._lag_limit
                and (skipped := self._skip(size - self._rotate_bytes // 8))
            ):
                budget = max(budget - skipped, 0) if closing else budget
                continue
            if size > self._rotate_bytes + (self._lag_limit if self._flooding else 0) and self._rotate(size):
                continue
            if unread <= 0 or budget == 0:
                return
            chunk = os.pread(self._fd, min(unread, _READ_CHUNK, budget if closing else unread), self._offset)
            if not chunk:
                return
            budget = budget - len(chunk) if closing else budget
            self._feed(chunk)

    def _rotate(self, size: int) -> bool:
        """Move the consumed head of an over-size file out (to ``.1``); True if the file shrank."""
        copy = not self._flooding or time.monotonic() - self._copied_at >= FLOOD_COPY_S
        if self._collapse_ok:
            done = (self._offset - len(self._pending)) // self._block * self._block
            last = (size - 1) // self._block * self._block  # a collapse must end before the end of the file
            whole = self._rotate_bytes // self._block * self._block
            cut = min(done if self._flooding else min(done, whole), last)
            if cut <= 0:
                return False
            try:
                if copy:
                    self._copy_out(max(cut - whole, 0), cut)
                _fallocate(self._fd, _PUNCH_HOLE, cut)  # the head's pages go without being written to disk
                _fallocate(self._fd, _COLLAPSE_RANGE, cut)  # so only the (short) rest is
            except OSError as exc:
                self.error = f"rotating {self.path} by copy and truncate: {exc}"
                self._collapse_ok = False
            else:
                self._restart(self._offset - cut, keep_partial=True)
                return True
        self._read_to(size)
        if copy:
            self._copy_out(max(size - self._rotate_bytes, 0), size)
        os.ftruncate(self._fd, 0)
        self._restart(0, keep_partial=True)
        return True

    def _copy_out(self, start: int, end: int) -> None:
        """Shift the rotated copies and copy bytes ``[start, end)`` of the file to ``.1``; no copy if keep is 0.
        A failed copy (a full disk) is reported in ``error``; the rotation goes on, to free the space."""
        if not self._keep:
            return
        name = self.path.name
        try:
            for i in range(self._keep - 1, 0, -1):
                older = self.path.with_name(f"{name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{name}.{i + 1}"))
            out = os.open(
                self.path.with_name(f"{name}.1"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666
            )
            try:
                while start < end:
                    sent = os.sendfile(out, self._fd, start, end - start)
                    if not sent:
                        break
                    start += sent
            finally:
                os.close(out)
            self._copied_at = time.monotonic()
        except OSError as exc:
            self.error = f"rotated copy of {self.path} failed: {exc}"

    def _read_to(self, end: int) -> None:
        """Read (skipping beyond the lag limit) up to ``end``: before a truncate, nothing unread may remain."""
        while self._offset < end:
            if end - self._offset > self._lag_limit and self._skip(end - self._rotate_bytes // 8):
                continue
            chunk = os.pread(self._fd, min(end - self._offset, _READ_CHUNK), self._offset)
            if not chunk:
                return
            self._feed(chunk)

    def _restart(self, offset: int, keep_partial: bool = False) -> None:
        """Continue reading at ``offset`` (the same bytes moved, or the file emptied): with the partial line
        still pending when the bytes only moved."""
        if not keep_partial:
            self._pending.clear()
            self._discarding = False
        self._offset = offset
        with self._lock:
            self._done = max(offset - len(self._pending), 0)

    def _skip(self, upto: int) -> int:
        """Jump to the first line that starts at or after ``upto``, counting the lines jumped over as unscanned
        (estimated from the density of lines just after ``upto``: reading them all would cost as much as the
        flood); the bytes skipped, 0 if no line starts within reach."""
        probe = os.pread(self._fd, _PROBE, upto)
        newline = probe.find(b"\n")
        if newline < 0:
            return 0
        target = upto + newline + 1
        skipped = target - self._offset
        lines = max(round(skipped * probe.count(b"\n") / len(probe)), 1)
        self._pending.clear()
        self._discarding = False
        self._flooding = True
        self._notable.unscanned_lines += lines
        self._offset = target
        with self._lock:
            self._done = target
            self._ring.clear()  # the ring holds the last lines in order: those before the gap no longer are
            self._count += lines
        return skipped

    def _feed(self, chunk: bytes) -> None:
        """The next bytes of the file: whole lines in bulk (one ring extend), over-long lines one by one."""
        self._offset += len(chunk)
        self._feed_lines(chunk)
        with self._lock:
            self._done = self._offset - len(self._pending)

    def _feed_lines(self, chunk: bytes) -> None:
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
        self._notable.scan(line, [line], self._count)
        with self._lock:
            self._ring.append(line)
            self._count += 1


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace").rstrip("\r")
