"""A FUSE file system whose reads never answer: a reader of its file ends up in D state, immune to SIGKILL.

This is how a rank stuck in a driver call looks to the supervisor: a process of ours that a SIGKILL does not
end. The kernel sends a FUSE READ to this server, which takes it and never replies; once a SIGKILL arrives for
the reader, the kernel waits uninterruptibly for the answer to a request the server already holds (state `D`).
Closing the server's end (`close()`) aborts the connection: the read fails, the SIGKILL is delivered, the process
dies.

The FUSE protocol is spoken directly over `/dev/fuse` (no libfuse): INIT, LOOKUP, GETATTR and OPEN are answered,
READ is kept, everything else gets ENOSYS. Mounting needs CAP_SYS_ADMIN; `StuckFs.available()` says whether it
can work here.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import struct
import subprocess
import threading
from pathlib import Path

_LOOKUP, _GETATTR, _OPEN, _READ, _INIT, _INTERRUPT, _DESTROY = 1, 3, 14, 15, 26, 36, 38
_IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_ATTR = struct.Struct(
    "<QQQQQQIIIIIIIIII"
)  # fuse_attr: ino size blocks a/m/ctime, nsecs, mode nlink uid gid rdev ...
_ROOT, _FILE = 1, 2
FILE_NAME = "stuck"
_SIZE = 4096


def _attr(node: int) -> bytes:
    mode = 0o040755 if node == _ROOT else 0o100644
    size = 0 if node == _ROOT else _SIZE
    return _ATTR.pack(node, size, 8, 0, 0, 0, 0, 0, 0, mode, 1, 0, 0, 0, 4096, 0)


class StuckFs:
    """Mount at `mountpoint`; `path` is a file whose reads never return until `close()`."""

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self.path = mountpoint / FILE_NAME
        self.held: list[int] = []  # READ requests taken and never answered
        self._stop = threading.Event()
        self._fd = os.open("/dev/fuse", os.O_RDWR)
        data = f"fd={self._fd},rootmode=40000,user_id=0,group_id=0".encode()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"stuckfs", str(mountpoint).encode(), b"fuse", 0x2 | 0x4, data) != 0:  # nosuid, nodev
            err = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(err, f"mount fuse on {mountpoint}: {os.strerror(err)}")
        self._thread = threading.Thread(target=self._serve, name="stuckfs", daemon=True)
        self._thread.start()

    @staticmethod
    def available() -> str:
        """'' when a FUSE mount can be made here, else why not."""
        if not os.path.exists("/dev/fuse"):
            return "no /dev/fuse"
        if os.geteuid() != 0:
            return "mounting FUSE without fusermount needs root"
        return ""

    def _reply(self, unique: int, error: int = 0, body: bytes = b"") -> None:
        with contextlib.suppress(OSError):
            os.write(self._fd, _OUT_HEADER.pack(_OUT_HEADER.size + len(body), -error, unique) + body)

    def _serve(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            try:
                request = os.read(self._fd, 1 << 20)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN):
                    continue
                return  # ENODEV after unmount, EBADF after close()
            if len(request) < _IN_HEADER.size:
                continue
            _, opcode, unique, node, *_ = _IN_HEADER.unpack_from(request)
            body = request[_IN_HEADER.size :]
            if opcode == _INIT:
                _major, minor, readahead = struct.unpack_from("<III", body)
                out = struct.pack(
                    "<IIIIHHIIHHI", 7, min(minor, 31), readahead, 0, 16, 12, 1 << 17, 1, 32, 0, 0
                )
                self._reply(unique, body=out + bytes(28))
            elif opcode == _LOOKUP:
                name = body.split(b"\0", 1)[0].decode()
                if node == _ROOT and name == FILE_NAME:
                    self._reply(unique, body=struct.pack("<QQQQII", _FILE, 0, 60, 60, 0, 0) + _attr(_FILE))
                else:
                    self._reply(unique, errno.ENOENT)
            elif opcode == _GETATTR:
                self._reply(unique, body=struct.pack("<QII", 60, 0, 0) + _attr(node))
            elif opcode == _OPEN:
                # FOPEN_DIRECT_IO: every read is a request the reader waits on, no page cache
                self._reply(unique, body=struct.pack("<QII", 0, 1, 0))
            elif opcode == _READ:
                self.held.append(unique)
            elif opcode in (_INTERRUPT, _DESTROY):
                continue
            else:
                self._reply(unique, errno.ENOSYS)

    def close(self) -> None:
        """Abort the connection (every held read fails with ENOTCONN) and detach the mount; a second call does nothing
        (the fd number may belong to someone else by then)."""
        if self._fd < 0:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        fd, self._fd = self._fd, -1
        with contextlib.suppress(OSError):
            os.close(fd)  # the last reference to the connection: the kernel aborts it
        subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True, timeout=30, check=False)
