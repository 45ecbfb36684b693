"""Launcher: new session, environment, captured output, bounded ring, rotated log, truncated lines."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from supervisor.host import launcher, proctree
from supervisor.host.launcher import LINE_LIMIT, TRUNCATED, Launched
from tests.process.conftest import FIXTURES, Janitor, Tree
from tests.support.wait import wait_for

_PRINT_ENV = (
    "import os; "
    "[print(k + '=' + os.environ.get(k, '')) for k in "
    "('CUDA_VISIBLE_DEVICES', 'SGLSUP_RUN_ID', 'SGLSUP_SERVER', 'EXTRA', 'SPT_NOENV')]"
)


def _spawn(janitor: Janitor, argv: list[str], log: Path, **kwargs: int) -> Launched:
    run_id = f"launch-{os.getpid()}-{len(janitor.run_ids)}"
    janitor.run_ids.append(run_id)
    handle = launcher.spawn(argv, {"EXTRA": "yes"}, [2, 3], run_id, "decode", log, **kwargs)
    assert isinstance(handle, Launched), handle.reason
    janitor.launched.append(handle)
    return handle


def _all_lines(handle: Launched) -> Iterator[str]:
    cursor = 0
    while True:
        lines, cursor = handle.lines_since(cursor)
        yield from lines
        if not lines:
            return


def test_spawn_sets_session_gpus_and_marker(tmp_path: Path, janitor: Janitor) -> None:
    """The child leads its own process group and sees its GPUs, the run marker, SPT_NOENV and extra env."""
    handle = _spawn(janitor, [sys.executable, "-c", _PRINT_ENV], tmp_path / "env.log")
    wait_for(lambda: handle.returncode() == 0, 10, "a clean exit")
    assert handle.pgid == handle.pid != os.getpgrp()
    assert handle.close()
    expected = [
        "CUDA_VISIBLE_DEVICES=2,3",
        f"SGLSUP_RUN_ID={janitor.run_ids[-1]}",
        "SGLSUP_SERVER=decode",
        "EXTRA=yes",
        "SPT_NOENV=1",
    ]
    assert handle.tail(10) == expected
    assert (tmp_path / "env.log").read_text().splitlines() == expected


def test_log_flood_keeps_ring_bounded_and_rotates_file(tmp_path: Path, janitor: Janitor) -> None:
    """200k lines: the ring holds only ring_lines, the cursor counts all, the file rotates keeping N."""
    log = tmp_path / "flood.log"
    argv = [sys.executable, str(FIXTURES / "flood.py"), "200000", "10"]
    handle = _spawn(janitor, argv, log, ring_lines=500, rotate_bytes=256 * 1024, rotate_keep=2)
    wait_for(lambda: handle.returncode() == 0, 60, "a clean exit")
    assert handle.close(timeout_s=10)
    lines, cursor = handle.lines_since(0)
    assert cursor == 200002
    assert len(lines) == 500
    assert lines[-1] == "flood done"
    assert lines[-2] == "flood line 0199999 padding-padding-padding-padding"
    assert handle.lines_since(cursor) == ([], cursor)
    assert handle.tail(3) == lines[-3:]
    rotated = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("flood.log"))
    assert rotated == ["flood.log", "flood.log.1", "flood.log.2"]
    assert all(p.stat().st_size <= 256 * 1024 for p in tmp_path.glob("flood.log*"))
    assert log.read_text().splitlines()[-1] == "flood done"


def test_overlong_line_is_truncated(tmp_path: Path, janitor: Janitor) -> None:
    """A 100 KiB line is cut to 16 KiB plus a marker; the next line is intact."""
    argv = [sys.executable, str(FIXTURES / "flood.py"), "1", str(100 * 1024)]
    handle = _spawn(janitor, argv, tmp_path / "long.log")
    wait_for(lambda: handle.returncode() == 0, 10, "a clean exit")
    assert handle.close()
    lines = list(_all_lines(handle))
    assert lines[0] == "x" * LINE_LIMIT + TRUNCATED
    assert lines[1:] == ["flood line 0000000 padding-padding-padding-padding", "flood done"]


def test_missing_executable_is_a_result_not_an_exception(tmp_path: Path) -> None:
    """spawn returns ok=False with the reason when the program does not exist or argv is empty."""
    failed = launcher.spawn([str(tmp_path / "no-such-binary")], {}, [0], "r", "s", tmp_path / "x.log")
    assert not failed.ok
    assert "no-such-binary" in failed.reason
    assert not launcher.spawn([], {}, [0], "r", "s", tmp_path / "y.log").ok


def test_close_returns_while_an_orphan_keeps_the_log_open(
    tmp_path: Path, start_tree: Callable[..., Tree]
) -> None:
    """After main dies, a re-parented orphan still holds the log file; close() still ends the reader thread."""
    (tmp_path / "held").touch()
    tree = start_tree("--orphan-hold", str(tmp_path / "held"))
    os.kill(tree.main, signal.SIGKILL)
    wait_for(lambda: tree.launched.returncode() is not None, 10, "the main process exiting")
    assert tree.orphan is not None and proctree.is_alive(tree.orphan)
    assert tree.launched.close(timeout_s=5)


def test_output_ends_with_the_main_process_and_a_child_is_still_read(
    tmp_path: Path, janitor: Janitor
) -> None:
    """Output ends once the main process exited and its last line was read; a child's later lines still come."""
    go = tmp_path / "go"
    child = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\nprint('child late')"
    script = (
        f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "[print('main line', i) for i in range(1000)]; print('main exits', flush=True); sys.exit(3)"
    )
    handle = _spawn(janitor, [sys.executable, "-c", script], tmp_path / "ends.log")
    wait_for(handle.output_ended, 10, "the output of the main process ending")
    assert handle.returncode() == 3
    assert handle.tail(2) == ["main line 999", "main exits"]
    go.touch()
    wait_for(lambda: handle.tail(1) == ["child late"], 10, "the child's line after the main process ended")
