"""Our own death at each step of a recovery (SIGKILL), then a new daemon: one tree, the rung, a completed incident."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.support.daemon import Deployment, PdDeployment, deployment

# the log event after which the daemon is killed: at detection (forensics next), after the release, after relaunch
STEPS = {
    "at_detection": ("fault.detected", 1),
    "after_the_release": ("recovery.release", 1),
    "right_after_relaunch": ("server.started", 2),
}


def _events(dep: Deployment, event: str) -> int:
    """How many times the daemon logged `event` (its JSON log, all daemons of this deployment)."""
    log = dep.root / "daemon.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count(f'"event": "{event}"')


@pytest.mark.parametrize("step", sorted(STEPS))
def test_daemon_sigkilled_mid_recovery_and_restarted(tmp_path: Path, step: str) -> None:
    """SIGKILL of the daemon mid-recovery: the next daemon reaps by marker, launches once, completes the incident."""
    event, count = STEPS[step]
    with deployment(tmp_path) as dep:
        daemon = dep.start()
        first = dep.wait(lambda s: s.get("state") == "serving", what="serving")
        main = psutil.Process(first["pid"])
        rank = next(c for c in main.children(recursive=True) if "scheduler_TP1" in " ".join(c.cmdline()))
        rank.kill()
        dep.wait(lambda s: _events(dep, event) >= count, what=f"{event} x{count}", timeout=60)
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
        dep.start()
        again = dep.wait(
            lambda s: s.get("state") == "serving" and s["pid"] not in (first["pid"], None),
            what="serving under the new daemon",
            timeout=120,
        )
        mains = [p for p in dep.ours() if "simulator.launch_server" in " ".join(p.cmdline())]
        assert [p.pid for p in mains] == [again["pid"]], "exactly one tree: no orphan, no double launch"
        crash = [i for i in dep.status()["incidents"] if i["fault"] == "crash"]
        assert crash, "the crash is in the journal"
        if step != "right_after_relaunch":  # after the relaunch the first daemon had nothing left to do
            assert any("mid-recovery" in i["reason"] and i["recovered_at"] for i in crash), crash


def test_daemon_sigkilled_during_a_pd_ordered_restart(tmp_path: Path) -> None:
    """SIGKILL while a relaunched prefill's decode restart is under way (the decode kept the old prefill's
    endpoints: `prefill_replaced_decode_stale`): the new daemon brings all three back once."""
    dep = PdDeployment(tmp_path, decode_env={"SGLANG_SIM_SCENARIO": "prefill_replaced_decode_stale"})
    try:
        daemon = dep.start()
        first = dep.wait_all(lambda s: all(v["state"] == "serving" for v in s.values()), what="all serving")
        os.kill(first["prefill"]["pid"], signal.SIGKILL)
        dep.wait_all(
            lambda s: s["prefill"]["pid"] != first["prefill"]["pid"] and s["decode"]["state"] != "serving",
            timeout=180,
            what="the decode's restart after the prefill's",
        )
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
        dep.start()
        after = dep.wait_all(
            lambda s: (
                all(v["state"] == "serving" and v["pid"] for v in s.values())
                and all(s[n]["pid"] != first[n]["pid"] for n in ("prefill", "decode"))
            ),
            timeout=180,
            what="all three serving under the new daemon",
        )
        mains = [p for p in dep.ours() if "launch_server" in " ".join(p.cmdline())]
        assert sorted(p.pid for p in mains) == sorted([after["prefill"]["pid"], after["decode"]["pid"]])
    finally:
        dep.cleanup()
