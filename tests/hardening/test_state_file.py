"""Our own state lost: a truncated or corrupt `state.json` is logged, kept aside, and nothing is orphaned."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from supervisor.records.statefile import StateFile
from tests.support.daemon import deployment
from tests.support.wait import wait_for as poll

pytestmark = pytest.mark.hardening


@pytest.mark.parametrize(
    "text", ["", '{"daemon_pid": 12, "servers": {"sim": {"run_id": "r1", "pi', "[1, 2]", "\x00\xff"]
)
def test_a_corrupt_state_file_is_an_empty_state_kept_aside(tmp_path: Path, text: str) -> None:
    """Truncated, wrong-shaped or binary state.json: an empty state, the bad file renamed `.corrupt`."""
    path = tmp_path / "state.json"
    path.write_text(text, errors="surrogateescape")
    state = StateFile.load(path)
    assert state.servers == {} and state.daemon_pid == 0
    assert not path.exists() and (tmp_path / "state.json.corrupt").read_text(errors="surrogateescape") == text


def test_daemon_killed_then_state_truncated_reaps_by_marker_and_serves_once(tmp_path: Path) -> None:
    """SIGKILL of the daemon, state.json truncated: the new daemon says so, reaps the old tree, serves one tree."""
    with deployment(tmp_path, tp=2) as dep:
        daemon = dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", 90, "serving")
        old = psutil.Process(int(first["pid"]))
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=30)
        assert old.is_running(), "the server outlives its daemon until someone reaps it"
        state = tmp_path / "state" / "state.json"
        state.write_text(state.read_text()[:17])
        dep.start()
        again = dep.wait(lambda s: s["state"] == "serving" and s["pid"] != first["pid"], 120, "serving again")
        poll(lambda: not old.is_running() or old.status() == psutil.STATUS_ZOMBIE, 30, "the old main reaped")
        assert "state.unreadable" in dep.log_tail(100000)
        mains = [p for p in dep.ours() if "simulator.launch_server" in " ".join(p.cmdline())]
        assert [p.pid for p in mains] == [int(again["pid"])], "exactly one server tree, the new one"
