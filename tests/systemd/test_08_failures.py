"""Failures systemd must not retry, and those it retries only so often: a config error exits 78 and stays
failed with the field path in `systemctl status`; a daemon that fails at once reaches the start limit after
five starts. Both end with the unit started again on a good config."""

from __future__ import annotations

from tests.support.wait import wait_for
from tests.systemd.machine import CONFIG, FILES, UNIT, Machine

LIMIT = "Start request repeated too quickly"  # systemd's line when the start limit stops a restart


def test_a_config_error_exits_78_and_is_not_restarted(machine: Machine) -> None:
    """An invalid probe period: the start fails with status 78, the unit is failed (not auto-restarting), and
    `systemctl status` shows the field path."""
    machine.wait_serving()
    good = machine.sh(f"cat {CONFIG}")
    machine.put(CONFIG, good.replace("health_period_s = ", "health_period_s = -", 1))
    restarts = int(machine.prop("NRestarts"))
    restart = machine.systemctl("restart", UNIT)
    assert restart.returncode != 0
    failed = machine.show("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts")
    assert failed["ExecMainStatus"] == "78" and failed["Result"] == "exit-code", failed
    assert (failed["ActiveState"], failed["SubState"]) == ("failed", "failed"), "no auto-restart"
    assert int(failed["NRestarts"]) == restarts
    status = machine.systemctl("status", UNIT, "--no-pager", "-n", "20").stdout
    assert "servers[0].probes.health_period_s" in status and "status=78" in status, status
    machine.put(CONFIG, good)
    machine.reset()
    assert machine.systemctl("start", UNIT).returncode == 0


def test_a_daemon_that_fails_at_once_reaches_the_start_limit(machine: Machine) -> None:
    """The status port taken by another process: each start ends with `daemon.status_bind_failed` (no
    traceback), systemd restarts it after RestartSec=, and the fifth start in a row is the last ("Start request
    repeated too quickly"); a manual start is refused until `reset-failed`, then the unit starts again."""
    machine.wait_serving()
    assert machine.systemctl("stop", UNIT).returncode == 0
    machine.reset()
    machine.sh(f"systemd-run --unit=port-holder /usr/bin/python3 {FILES}/holdport.py 9400")
    try:
        wait_for(lambda: ":9400 " in machine.sh("ss -ltn"), 30, "the status port taken")
        cursor = machine.cursor()
        machine.systemctl("start", UNIT)
        wait_for(lambda: any(LIMIT in m for m in machine.messages(cursor)), 60, "the start limit")
        messages = machine.messages(cursor)
        starts = [m for m in messages if m.startswith("Starting ")]
        assert len(starts) == 5, "\n".join(messages)
        assert len(machine.events(cursor, "daemon.status_bind_failed")) == 5, "each start says why"
        assert machine.prop("NRestarts") == "5", "four restarts started, the fifth refused"
        assert not [m for m in messages if m.startswith("Traceback")], messages
        assert machine.show("ActiveState", "SubState") == {"ActiveState": "failed", "SubState": "failed"}
        assert machine.systemctl("start", UNIT).returncode != 0, "refused until reset-failed"
        assert any(LIMIT in m for m in machine.messages(cursor)[len(messages) :])
    finally:
        machine.sh("systemctl stop port-holder")
    machine.reset()
    assert machine.systemctl("start", UNIT).returncode == 0
