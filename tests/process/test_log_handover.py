"""The server's output outlives its reader: a file, not a pipe; attach resumes it; rotation bounds the disk."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.host import launcher, runlog
from supervisor.host.launcher import EXIT_UNKNOWN, Launched, SpawnFailed
from supervisor.host.proctree import start_ticks
from tests.process.conftest import FIXTURES, Janitor
from tests.support.wait import wait_for

MiB = 1024 * 1024


def _writer(
    janitor: Janitor, where: Path, head: int, lines: int, width: int, code: int, **kwargs: int
) -> Launched:
    """Start fixtures/writer.py with its output in where/server.log."""
    run_id = f"handover-{os.getpid()}-{len(janitor.run_ids)}"
    janitor.run_ids.append(run_id)
    argv = [
        sys.executable,
        str(FIXTURES / "writer.py"),
        str(where),
        str(head),
        str(lines),
        str(width),
        str(code),
    ]
    handle = launcher.spawn(argv, {}, [0], run_id, "handover", where / "server.log", **kwargs)
    assert isinstance(handle, Launched), handle.reason
    janitor.launched.append(handle)
    return handle


def _attach(janitor: Janitor, pid: int, pgid: int, log: Path, offset: int, **kwargs: int) -> Launched:
    handle = launcher.attach(pid, pgid, log, offset, **kwargs)
    assert isinstance(handle, Launched), handle.reason
    janitor.launched.append(handle)
    return handle


def _read_all(handle: Launched, expected: int) -> list[str]:
    """Every line the handle captures, until ``expected`` lines came (the cursor never goes back)."""
    got: list[str] = []
    cursor = 0

    def more() -> bool:
        nonlocal cursor
        lines, cursor = handle.lines_since(cursor)
        got.extend(lines)
        return len(got) >= expected

    wait_for(more, 30, f"{expected} lines")
    return got


def _line(i: int, width: int) -> str:
    return (f"line {i:06d} ").ljust(width - 1, "-")


def test_lines_written_with_no_reader_are_read_once_by_the_attached_successor(
    tmp_path: Path, janitor: Janitor
) -> None:
    """5000 lines written while no reader exists: attach at the saved offset reads each exactly once, in order."""
    first = _writer(janitor, tmp_path, 100, 5000, 80, 3, ring_lines=10000)
    wait_for(lambda: first.tail(1) == ["head 000099"], 10, "the head lines")
    assert first.close()
    offset = first.log_offset()
    assert first.lines_since(0) == ([f"head {i:06d}" for i in range(100)], 100)
    (tmp_path / "go").touch()
    wait_for((tmp_path / "written").exists, 30, "the child writing with nobody reading")
    second = _attach(janitor, first.pid, first.pgid, first.log_path, offset, ring_lines=10000)
    assert _read_all(second, 5000) == [_line(i, 80) for i in range(5000)]
    (tmp_path / "exit").touch()
    wait_for(lambda: second.returncode() is not None, 10, "the exit")
    assert second.returncode() == 3 and second.exit_known, "our own child: its status is known"
    wait_for(second.output_ended, 10, "the output ended")
    assert second.lines_since(5000) == ([], 5000)


def test_a_server_with_no_reader_never_blocks(tmp_path: Path, janitor: Janitor) -> None:
    """With its reader gone the server writes 2 MiB unhindered and exits 0; the file holds all of it."""
    handle = _writer(janitor, tmp_path, 0, 2 * MiB // 128, 128, 0)
    assert handle.close()
    (tmp_path / "exit").touch()
    (tmp_path / "go").touch()
    wait_for(lambda: handle.returncode() is not None, 30, "the exit")
    assert handle.returncode() == 0
    written = (tmp_path / "server.log").read_bytes()
    assert len(written) == 2 * MiB
    assert written.endswith((_line(2 * MiB // 128 - 1, 128) + "\n").encode())


def test_attach_to_a_process_that_is_not_our_child(tmp_path: Path, janitor: Janitor) -> None:
    """A re-parented process: returncode None while it lives, EXIT_UNKNOWN once it died; its lines are read."""
    log = tmp_path / "orphan.log"
    script = "import time; print('orphan ready', flush=True); time.sleep(120)"
    starter = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {script!r}], stdout=open({str(log)!r}, 'ab'), "
        "stderr=subprocess.STDOUT, start_new_session=True); print(p.pid)"
    )
    pid = int(subprocess.run([sys.executable, "-c", starter], capture_output=True, check=True).stdout)
    handle = _attach(janitor, pid, pid, log, 0)
    assert handle.returncode() is None and not handle.exit_known
    wait_for(lambda: handle.tail(1) == ["orphan ready"], 10, "its line")
    assert not handle.output_ended()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: handle.returncode() is not None, 10, "its end seen through the pidfd")
    assert handle.returncode() == EXIT_UNKNOWN
    wait_for(handle.output_ended, 10, "the output ended")


def test_attach_refuses_a_gone_pid_a_reused_pid_and_a_missing_log(tmp_path: Path) -> None:
    """attach is a result, not an exception: a dead PID, another process at the PID, an unreadable log."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
    )
    gone = launcher.attach(int(done.stdout), 1, tmp_path / "x.log", 0)
    assert isinstance(gone, SpawnFailed) and "gone" in gone.reason
    log = tmp_path / "me.log"
    log.touch()
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    reused = launcher.attach(os.getpid(), os.getpgrp(), log, 0, start_ticks=ticks + 1)
    assert isinstance(reused, SpawnFailed) and "another process" in reused.reason
    missing = launcher.attach(os.getpid(), os.getpgrp(), tmp_path / "none.log", 0, start_ticks=ticks)
    assert isinstance(missing, SpawnFailed) and "none.log" in missing.reason


def test_rotation_while_the_reader_keeps_up_loses_nothing(tmp_path: Path, janitor: Janitor) -> None:
    """10 MB rotated at 256 KiB: each file within the bound, and the files in order are the output byte for byte."""
    log = tmp_path / "flood.log"
    run_id = f"rotate-{os.getpid()}"
    janitor.run_ids.append(run_id)
    argv = [sys.executable, str(FIXTURES / "flood.py"), "200000", "10"]
    handle = launcher.spawn(argv, {}, [0], run_id, "rotate", log, rotate_bytes=256 * 1024, rotate_keep=60)
    assert isinstance(handle, Launched), handle.reason
    janitor.launched.append(handle)
    wait_for(lambda: handle.returncode() == 0, 60, "a clean exit")
    assert handle.close(timeout_s=10)
    if handle.log_error is not None:
        pytest.skip(f"this filesystem cannot cut a file's head: {handle.log_error}")
    files = [*sorted(tmp_path.glob("flood.log.*"), key=lambda p: -int(p.suffix[1:])), log]
    assert len(files) > 30
    assert all(f.stat().st_size <= 256 * 1024 for f in files)
    expected = (
        "x" * 10
        + "\n"
        + "".join(f"flood line {i:07d} padding-padding-padding-padding\n" for i in range(200000))
    )
    assert b"".join(f.read_bytes() for f in files) == (expected + "flood done\n").encode()


def test_a_flood_beyond_the_reader_is_skipped_and_the_disk_stays_bounded(
    tmp_path: Path, janitor: Janitor
) -> None:
    """40 MiB waiting unread at attach: lines skipped as unscanned, the newest read, files within the bound."""
    lines, width, bound = 40 * MiB // 128, 128, MiB
    first = _writer(janitor, tmp_path, 0, lines, width, 0)
    assert first.close()
    (tmp_path / "go").touch()
    wait_for((tmp_path / "written").exists, 60, "40 MiB written")
    second = _attach(
        janitor, first.pid, first.pgid, first.log_path, first.log_offset(), rotate_bytes=bound, rotate_keep=2
    )
    wait_for(lambda: second.tail(1) == [_line(lines - 1, width)], 30, "the newest line")
    wait_for(
        lambda: (tmp_path / "server.log").stat().st_size <= bound, 30, "the file rotated within its bound"
    )
    assert second.unscanned_lines > 0
    tail = second.tail(2000)
    assert tail == [_line(i, width) for i in range(lines - len(tail), lines)], (
        "the newest lines, none missing"
    )
    files = list(tmp_path.glob("server.log*"))
    assert all(f.stat().st_size <= bound for f in files)
    assert sum(f.stat().st_size for f in files) <= 3 * bound
    (tmp_path / "exit").touch()


def test_where_the_head_cannot_be_cut_copy_and_truncate_bounds_the_disk(
    tmp_path: Path, janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem without collapse (tmpfs, btrfs): rotation by copy and truncate keeps the files bounded."""

    def unsupported(fd: int, mode: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(runlog, "_fallocate", unsupported)
    log = tmp_path / "flood.log"
    run_id = f"truncate-{os.getpid()}"
    janitor.run_ids.append(run_id)
    argv = [sys.executable, str(FIXTURES / "flood.py"), "200000", "10"]
    handle = launcher.spawn(argv, {}, [0], run_id, "rotate", log, rotate_bytes=256 * 1024, rotate_keep=2)
    assert isinstance(handle, Launched), handle.reason
    janitor.launched.append(handle)
    wait_for(lambda: handle.returncode() == 0, 60, "a clean exit")
    assert handle.close(timeout_s=10)
    assert handle.log_error is not None and "copy and truncate" in handle.log_error
    files = sorted(p.name for p in tmp_path.glob("flood.log*"))
    assert files == ["flood.log", "flood.log.1", "flood.log.2"]
    assert all((tmp_path / f).stat().st_size <= 256 * 1024 for f in files)
    assert len(handle.tail(100)) == 100
