"""A daemon SIGKILLed (`systemctl kill -s KILL --kill-whom=main`; a kernel OOM kill is the same SIGKILL to
systemd) is restarted after RestartSec= and adopts the server: no second tree, no incident, and the journal
says why."""

from __future__ import annotations

from tests.systemd.machine import Machine


def test_a_killed_daemon_is_restarted_and_adopts_the_server(machine: Machine) -> None:
    """SIGKILL of the main process: the journal says `status=9/KILL`, a new daemon adopts the same server soon
    after — within RestartSec= plus its own start — and nothing else changes."""
    first = machine.wait_serving()
    incidents = len(machine.incidents())
    gaps = []
    for _ in range(2):
        before = machine.status()
        assert before is not None
        cursor = machine.cursor()
        killed_at = machine.kill("KILL")
        after = machine.wait_new_daemon(before)
        messages = machine.messages(cursor)
        assert any("Main process exited, code=killed, status=9/KILL" in m for m in messages), messages
        assert any("Scheduled restart job" in m for m in messages), messages
        assert after["servers"][0]["pid"] == first["pid"] and machine.one_tree()
        gaps.append(machine.gap(killed_at, after, ("RestartUSec",)))
    assert len(machine.incidents()) == incidents, "an adoption is no incident"
    machine.record("gap after a SIGKILL (kill to adopted)", ", ".join(f"{g:.2f} s" for g in gaps))
