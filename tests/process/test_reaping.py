"""Every process reaped: the daemon as a child subreaper (supervisor.host.reaping) and `run` as PID 1 of a PID
namespace (supervisor.pid1), with real processes, signals and namespaces."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.wait import wait_for

FAKE = Path(__file__).parent / "fixtures" / "fake_daemon.py"

REAPER_SCRIPT = """
import json, os, subprocess, sys, time
from supervisor.host import reaping
assert reaping.become_subreaper() and reaping.is_subreaper()
reaper = reaping.OrphanReaper(grace_s=0.2)
middle = os.fork()
if middle == 0:
    if os.fork() == 0:
        time.sleep(0.3)
        os._exit(7)
    os._exit(0)
os.waitpid(middle, 0)
claimed = subprocess.Popen(["true"])
reaping.claim(claimed.pid)
reaped = []
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not any(r.status == 7 for r in reaped):
    reaped += reaper.reap()
    time.sleep(0.05)
left = reaping.zombie_children()
print(json.dumps({"reaped": [[r.pid, r.name, r.status] for r in reaped], "claimed_left": claimed.pid in left,
                  "claimed_status": claimed.wait()}))
"""


def test_an_orphan_reparents_to_the_subreaper_and_is_reaped_with_its_status() -> None:
    """A grandchild orphaned by its parent re-parents to the subreaper, which reaps it and keeps its exit status;
    a child whose owner waits for it (claimed) is left to the owner, who gets its real status."""
    out = subprocess.run(
        [sys.executable, "-c", REAPER_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(out.stdout.splitlines()[-1])
    assert [status for _, _, status in result["reaped"]] == [7], result
    assert result["claimed_left"] is True
    assert result["claimed_status"] == 0


needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="PID namespaces need root and unshare"
)


class Pid1:
    """`supervisor.pid1` as PID 1 of a new PID namespace over the fake daemon."""

    def __init__(self, tmp: Path, mode: str) -> None:
        self.tmp = tmp
        code = (
            "import sys; from supervisor import pid1; "
            f"sys.exit(pid1.run([sys.executable, {str(FAKE)!r}, {mode!r}, {str(tmp)!r}]))"
        )
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def leader(self) -> int:
        """The host PID of PID 1 (the child of unshare)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return wait_for(lambda: int((children.read_text().split() or ["0"])[0]), 10, "PID 1 running")

    def starts(self) -> list[str]:
        path = self.tmp / "starts"
        return path.read_text().split() if path.exists() else []

    def stop_when_ready(self, start: int, also: str = "") -> tuple[int, list[dict[str, Any]]]:
        """Once the `start`-th daemon runs (and the fixture wrote `also`), `docker stop` (SIGTERM to PID 1); PID
        1's status and log."""
        leader = self.leader()
        wait_for(lambda: (self.tmp / f"ready-{start}").exists(), 30, f"daemon start {start} running")
        if also:
            wait_for(lambda: (self.tmp / also).exists(), 30, also)
        os.kill(leader, signal.SIGTERM)
        return self.finish()

    def finish(self, timeout_s: float = 60) -> tuple[int, list[dict[str, Any]]]:
        """PID 1's exit status and its log lines."""
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode, [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def events(log: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [record for record in log if record["event"] == name]


@needs_namespaces
def test_pid1_restarts_a_crashed_daemon_reaps_its_orphan_and_forwards_sigterm(tmp_path: Path) -> None:
    """The daemon SIGKILLed: PID 1 reaps the orphan it left (status 3 logged), starts a new daemon, passes it
    SIGTERM and exits with its status 0."""
    init = Pid1(tmp_path, "crash_once")
    code, log = init.stop_when_ready(2, also="orphan-exits")  # a loaded machine may start the daemon first
    assert code == 0
    assert len(init.starts()) == 2
    assert [e["status"] for e in events(log, "init.daemon_exited")] == [-9, 0]
    assert 3 in [e["status"] for e in events(log, "init.reaped")]
    assert [e["signal"] for e in events(log, "init.forwarded")] == ["SIGTERM"]
    assert not events(log, "init.leftover")


@needs_namespaces
def test_pid1_ends_with_78_on_a_config_error_without_restarting(tmp_path: Path) -> None:
    """A config error is not restarted: the container exits 78 after one start."""
    init = Pid1(tmp_path, "config_error")
    code, log = init.finish()
    assert (code, len(init.starts())) == (78, 1)
    assert events(log, "init.exit")[0]["status"] == 78


@needs_namespaces
def test_pid1_ends_with_69_when_the_status_port_is_taken_without_restarting(tmp_path: Path) -> None:
    """The daemon's status port taken (on a container's host network): a retry would fail the same way, so the
    container exits 69 after one start, PID 1 saying why."""
    init = Pid1(tmp_path, "port_taken")
    code, log = init.finish()
    assert (code, len(init.starts())) == (69, 1)
    assert "status port is taken" in events(log, "init.daemon_failed")[0]["hint"]


@needs_namespaces
def test_pid1_gives_up_after_five_quick_failures(tmp_path: Path) -> None:
    """A daemon that fails at once is started five times, then the container exits with its status."""
    init = Pid1(tmp_path, "always_fail")
    code, log = init.finish()
    assert (code, len(init.starts())) == (1, 5)
    assert events(log, "init.start_limit")


@needs_namespaces
def test_pid1_kills_what_outlives_the_daemons_stop(tmp_path: Path) -> None:
    """After the daemon's clean exit, a process it left behind is killed and named before PID 1 exits."""
    init = Pid1(tmp_path, "leftover")
    code, log = init.stop_when_ready(1)
    assert code == 0
    assert len(events(log, "init.leftover")[0]["killed"]) == 1
