"""A rank that will not die, for real: a process of the server's run, holding a GPU, stuck in D state.

The stuck process reads a file of a FUSE file system whose server never answers (`tests/support/stuckfs.py`):
once SIGKILLed it waits uninterruptibly in the kernel, as a rank stuck in a driver call does. The daemon must
take the documented path — the release fails, the server is `failed` with a paged incident, nothing is launched
onto the GPU it holds, an operator restart while it is still stuck changes nothing — and, once the process can
die, an operator restart verifies the release again and relaunches.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.daemon import Deployment, deployment
from tests.support.stuckfs import StuckFs
from tests.support.wait import wait_for

pytestmark = pytest.mark.hardening

# Holds the GPU's device file, then reads the file whose read never returns.
STUCK = "import os, sys; os.open(sys.argv[1], os.O_RDWR); os.read(os.open(sys.argv[2], os.O_RDONLY), 16)"


@contextlib.contextmanager
def stuck_fs(mountpoint: Path) -> Iterator[StuckFs]:
    """A mounted StuckFs for the block (skips where FUSE cannot be mounted)."""
    why = StuckFs.available()
    if why:
        pytest.skip(why)
    mountpoint.mkdir()
    try:
        fs = StuckFs(mountpoint)
    except OSError as exc:
        pytest.skip(f"cannot mount FUSE here: {exc}")
    try:
        yield fs
    finally:
        fs.close()


def environ(pid: int) -> dict[str, str]:
    """The environment of `pid` (the run marker included)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def failed_releases(dep: Deployment) -> int:
    """`recovery.release` events with ok false in the daemon's log."""
    events = (
        json.loads(line)
        for line in (dep.root / "daemon.log").read_text().splitlines()
        if line.startswith("{")
    )
    return sum(1 for e in events if e.get("event") == "recovery.release" and e.get("ok") is False)


@contextlib.contextmanager
def stuck_rank(fs: StuckFs, device: Path, run_env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A process of the run (its marker in the environment) holding `device`, its read held by `fs`.

    On leaving, the file system's connection is aborted and the process, SIGKILLed by then, must die.
    """
    stuck = subprocess.Popen(
        [sys.executable, "-c", STUCK, str(device), str(fs.path)], env=run_env, start_new_session=True
    )
    try:
        wait_for(lambda: bool(fs.held), 30, "the stuck rank's read held by the file system")
        yield stuck
    finally:
        fs.close()
        if stuck.poll() is None:
            stuck.kill()
        assert stuck.wait(timeout=30) == -signal.SIGKILL, "the stuck rank dies once its read fails"


def failed(s: dict[str, Any]) -> bool:
    return bool(s["state"] == "failed")


def test_a_rank_in_d_state_fails_the_server_pages_and_nothing_is_launched_onto_its_gpu(
    tmp_path: Path,
) -> None:
    """SIGKILL cannot end the stuck rank: failed + page, no relaunch (even on restart) until it can die."""
    with deployment(tmp_path, restart={"initial_s": 0}) as dep, stuck_fs(tmp_path / "mnt") as fs:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", 90, "serving")
        with stuck_rank(fs, dep.devices[0], environ(first["pid"])) as stuck:
            os.kill(first["pid"], signal.SIGKILL)
            down = dep.wait(failed, 120, "failed: the release cannot complete")
            assert "release failed" in down["reason"] and str(stuck.pid) in down["reason"], down["reason"]
            assert psutil.Process(stuck.pid).status() == psutil.STATUS_DISK_SLEEP, "SIGKILLed, still alive"
            assert down["last_incident"]["severity"] == "page", down["last_incident"]
            assert [p.pid for p in dep.ours()] == [stuck.pid], "nothing launched beside the stuck rank"

            assert failed_releases(dep) == 1
            assert dep.post("/control/restart", {"reason": "still stuck"}, token=dep.token)[0] == 200
            wait_for(lambda: failed_releases(dep) == 2, 120, "the release verified again, and failed again")
            again = dep.server()
            assert failed(again) and again["pid"] is None, again
            assert [p.pid for p in dep.ours()] == [stuck.pid], "a restart never launches onto a held GPU"

        assert dep.post("/control/restart", {"reason": "the stuck rank is gone"}, token=dep.token)[0] == 200
        back = dep.wait(lambda s: s["state"] == "serving", 90, "serving after the operator's restart")
        assert back["pid"] != first["pid"]


def test_the_daemon_sigkilled_while_waiting_for_the_gpus_is_failed_again_when_restarted(
    tmp_path: Path,
) -> None:
    """Our own death while the release waits for a GPU held by a stuck rank: the next daemon reaps by marker,
    cannot release either, pages, launches nothing; once the rank can die, one restart brings one tree back."""
    with deployment(tmp_path, restart={"initial_s": 0}) as dep, stuck_fs(tmp_path / "mnt") as fs:
        daemon = dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", 90, "serving")
        with stuck_rank(fs, dep.devices[0], environ(first["pid"])) as stuck:
            os.kill(first["pid"], signal.SIGKILL)
            wait_for(
                lambda: psutil.Process(stuck.pid).status() == psutil.STATUS_DISK_SLEEP,
                60,
                "the release under way: the stuck rank SIGKILLed, the GPU still held",
            )
            assert failed_releases(dep) == 0, "killed while the release still waits"
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)
            dep.start()
            down = dep.wait(failed, 120, "failed under the new daemon: the previous run cannot be reaped")
            assert f"pid {stuck.pid}" in down["reason"] and "disk-sleep" in down["reason"], down["reason"]
            assert down["last_incident"]["severity"] == "page", down["last_incident"]
            assert [p.pid for p in dep.ours()] == [stuck.pid], "no launch by the new daemon"

        assert dep.post("/control/restart", {"reason": "the stuck rank is gone"}, token=dep.token)[0] == 200
        back = dep.wait(lambda s: s["state"] == "serving", 90, "serving after the operator's restart")
        mains = [p for p in dep.ours() if "simulator.launch_server" in " ".join(p.cmdline())]
        assert [p.pid for p in mains] == [back["pid"]], "exactly one tree"
