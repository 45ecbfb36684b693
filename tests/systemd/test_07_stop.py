"""`systemctl stop` drains and stops everything within TimeoutStopSec=: the unit's cgroup empty, every GPU
device path free, nothing left running; `systemctl restart` reloads the server and ends with one tree."""

from __future__ import annotations

import time

from tests.systemd.machine import DEVICES, UNIT, Machine


def cgroup_procs(machine: Machine, group: str) -> list[int]:
    """PIDs in the unit's cgroup, on the named systemd hierarchy and the unified one (gone: none)."""
    out = machine.sh(
        f"cat /sys/fs/cgroup/systemd{group}/cgroup.procs /sys/fs/cgroup/unified{group}/cgroup.procs 2>/dev/null"
        " || true"
    )
    return [int(x) for x in out.split()]


def test_stop_leaves_nothing_within_the_stop_timeout(machine: Machine) -> None:
    """The drain ends well inside TimeoutStopSec= (no SIGKILL by systemd): the cgroup holds no process, no
    process holds a GPU device path, and systemd reports no process left running."""
    machine.wait_serving()
    group = machine.prop("ControlGroup")
    assert group.endswith(f"/{UNIT}.service") and cgroup_procs(machine, group), group
    cursor = machine.cursor()
    started = time.monotonic()
    stop = machine.systemctl("stop", UNIT)
    took = time.monotonic() - started
    assert stop.returncode == 0, stop.stdout + stop.stderr
    machine.record("systemctl stop (drain, reap, GPUs free)", f"{took:.2f} s")
    after = machine.show("ActiveState", "Result", "TimeoutStopUSec")
    assert (after["ActiveState"], after["Result"]) == ("inactive", "success"), after
    assert took < machine.delay_s("TimeoutStopUSec"), "systemd's SIGKILL is a backstop, not the normal path"
    assert cgroup_procs(machine, group) == [], "the unit's cgroup is empty"
    assert machine.holders(DEVICES) == [] and machine.trees() == [] and machine.ranks() == []
    messages = machine.messages(cursor)
    assert not [m for m in messages if "remains running" in m or "left-over process" in m], messages
    assert machine.events(cursor, "daemon.stopped")
    start = machine.systemctl("start", UNIT)
    assert start.returncode == 0, start.stdout + start.stderr


def test_restart_reloads_the_server_and_ends_with_one_tree(machine: Machine) -> None:
    """`systemctl restart`: a new daemon and a new server (the model reloads), and exactly one tree."""
    first = machine.wait_serving()
    pid = machine.main_pid()
    restart = machine.systemctl("restart", UNIT)
    assert restart.returncode == 0, restart.stdout + restart.stderr
    again = machine.wait_serving()
    assert machine.main_pid() != pid and again["pid"] != first["pid"] and not again["adopted"], again
    assert machine.trees() == [again["pid"]] and machine.one_tree()
