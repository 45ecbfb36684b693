"""Which processes hold a file: an open fd on its path, or a mapping of it, from a ``/proc`` scan."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from supervisor.host import proctree

_PROC = Path("/proc")
_MAPS_LIMIT = 16 * 1024 * 1024

FileId = tuple[int, int, int]


def open_holders(paths: Sequence[Path], include_maps: bool = False) -> dict[Path, set[int]]:
    """PIDs with an fd (or, with ``include_maps``, a mapping) on each path.

    Mappings are matched by device and inode, not by name: a POSIX semaphore (``sem.mp-*``) is
    mapped under the temporary name glibc created it with, which ``maps`` shows as ``(deleted)``
    once the file is linked to its real name.
    """
    wanted = {os.path.realpath(p): Path(p) for p in paths}
    ids = _file_ids(paths) if include_maps else {}
    found: dict[Path, set[int]] = {Path(p): set() for p in paths}
    for pid in proctree.all_pids():
        for target in _fd_targets(pid):
            if target in wanted:
                found[wanted[target]].add(pid)
        for ident in _mapped_ids(pid) if ids else ():
            if ident in ids:
                found[ids[ident]].add(pid)
    return found


def _file_ids(paths: Sequence[Path]) -> dict[FileId, Path]:
    ids = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        ids[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = Path(path)
    return ids


def _fd_targets(pid: int) -> set[str]:
    fd_dir = _PROC / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return set()
    targets = set()
    for name in names:
        try:
            targets.add(os.readlink(fd_dir / name))
        except OSError:
            continue
    return targets


def _mapped_ids(pid: int) -> set[FileId]:
    """(major, minor, inode) of every file ``pid`` maps (``maps``: range perms offset dev inode path)."""
    try:
        with open(_PROC / str(pid) / "maps", "rb") as fh:
            raw = fh.read(_MAPS_LIMIT)
    except OSError:
        return set()
    ids = set()
    for line in raw.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5 or parts[4] == b"0":
            continue
        major, _, minor = parts[3].partition(b":")
        try:
            ids.add((int(major, 16), int(minor, 16), int(parts[4])))
        except ValueError:
            continue
    return ids
