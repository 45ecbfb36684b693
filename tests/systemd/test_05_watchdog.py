"""systemd's watchdog: a daemon that stops answering (SIGSTOP) is aborted after WatchdogSec=, restarted after
RestartSec=, and the new daemon adopts the server (same SGLang main PID, no incident) — every time; also when
it was stopped in the middle of a recovery (the run is replaced and the incident completed) and in the middle
of a handover's re-exec."""

from __future__ import annotations

from tests.support.wait import wait_for
from tests.systemd.machine import STATE, UNIT, Machine

ROUNDS = 3  # aborts in a row, each adopting the same server


def aborted(machine: Machine, cursor: str) -> list[str]:
    return [m for m in machine.messages(cursor) if "Failed with result 'watchdog'" in m]


def test_a_stopped_daemon_is_aborted_restarted_and_adopts_every_time(machine: Machine) -> None:
    """SIGSTOP, ROUNDS times: each a watchdog abort, a restart and an adoption of the same server, no incident."""
    first = machine.wait_serving()
    incidents = len(machine.incidents())
    gaps = []
    for _ in range(ROUNDS):
        before = machine.status()
        assert before is not None
        cursor = machine.cursor()
        stopped_at = machine.kill("SIGSTOP")
        after = machine.wait_new_daemon(before)
        assert aborted(machine, cursor), "systemd's watchdog did it"
        assert after["servers"][0]["pid"] == first["pid"], "the same server, adopted"
        gaps.append(machine.gap(stopped_at, after, ("WatchdogUSec", "RestartUSec")))
        assert machine.one_tree()
    assert len(machine.incidents()) == incidents, "an adoption is no incident"
    assert int(machine.prop("NRestarts")) >= ROUNDS
    machine.record("gap after a watchdog abort (SIGSTOP to adopted)", ", ".join(f"{g:.2f} s" for g in gaps))


def test_a_daemon_stopped_mid_recovery_is_replaced_and_its_incident_completed(machine: Machine) -> None:
    """A rank killed, the daemon stopped as soon as it journaled the incident: after the watchdog's restart the
    run is replaced (an `adopt_refused` notice naming the interrupted incident), that incident completed, one
    tree serving."""
    first = machine.wait_serving()
    known = {i["id"] for i in machine.incidents()}
    cursor = machine.cursor()
    journal = f"{STATE}/incidents.jsonl"
    # One script inside the container, so the stop lands within a few milliseconds of the incident's line.
    machine.sh(
        f"P=$(systemctl show -p MainPID --value {UNIT}); N=$(cat {journal} 2>/dev/null | wc -l);"
        f" kill -KILL {machine.ranks()[0][0]};"
        f' timeout 30 sh -c "until [ \\$(cat {journal} | wc -l) -gt $N ]; do :; done" && kill -STOP $P'
    )
    stopped = [i for i in machine.incidents() if i["id"] not in known]
    assert len(stopped) == 1 and not stopped[0].get("recovered_at"), f"stopped mid-recovery: {stopped}"
    wait_for(lambda: aborted(machine, cursor), 30, "the watchdog's abort")
    cured = machine.wait_server(
        lambda s: s["state"] == "serving" and s["pid"] != first["pid"], 90, "relaunched"
    )
    new = {i["fault"]: i for i in machine.incidents() if i["id"] not in known}
    assert set(new) == {"crash", "adopt_refused"}, new
    assert new["crash"]["id"] == stopped[0]["id"] and new["crash"].get("recovered_at"), (
        "the incident completed"
    )
    assert stopped[0]["id"] in new["adopt_refused"]["evidence"]["reason"], (
        "the refusal names the interrupted one"
    )
    assert not cured["adopted"] and machine.one_tree()


def test_a_daemon_stopped_mid_handover_is_aborted_and_its_successor_adopts(machine: Machine) -> None:
    """SIGUSR2, then SIGSTOP of the re-executed daemon before it is up: the watchdog (lengthened for the
    handover) aborts it, and the restarted daemon adopts the same server."""
    first = machine.wait_serving()
    before = machine.status()
    assert before is not None
    cursor = machine.cursor()
    stopped_at = float(machine.sh("date +%s.%N"))
    machine.sh(
        f"P=$(systemctl show -p MainPID --value {UNIT}); kill -USR2 $P; "
        'timeout 20 sh -c "until grep -q supervisor.cli /proc/$P/cmdline; do :; done" && kill -STOP $P'
    )
    after = machine.wait_new_daemon(before, timeout_s=90)
    assert aborted(machine, cursor)
    assert after["servers"][0]["pid"] == first["pid"] and machine.one_tree()
    adopted = float(after["servers"][0]["adopted"]["at"])
    machine.record(
        "gap after a watchdog abort mid-handover (SIGUSR2 to adopted)", f"{adopted - stopped_at:.2f} s"
    )
