"""`systemctl enable --now` on the installed unit: it returns once the daemon sent READY=1, and the unit's
StatusText follows the daemon's state while the server loads."""

from __future__ import annotations

import time

from tests.support.wait import wait_for
from tests.systemd.machine import STATUS_URL, UNIT, Machine


def test_start_returns_after_ready_and_status_text_follows_the_server(machine: Machine) -> None:
    """When `systemctl start` returns the unit is active and the status endpoint answers at once; StatusText
    goes from starting to serving while `is-active` says active."""
    before = time.monotonic()
    started = machine.systemctl("enable", "--now", UNIT)
    returned = time.monotonic()
    assert started.returncode == 0, started.stdout + started.stderr
    first = machine.show("ActiveState", "StatusText")
    healthz = machine.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", STATUS_URL + "/healthz"])
    assert first["ActiveState"] == "active", first
    assert healthz.stdout == "200", "the status endpoint must answer once start returned (READY=1 follows it)"
    assert first["StatusText"].split(":")[0] in ("stopped", "starting"), first
    exec_at = machine.monotonic_s("ExecMainStartTimestampMonotonic")
    ready_at = machine.monotonic_s("ActiveEnterTimestampMonotonic")
    assert exec_at < ready_at <= returned, "systemd saw READY=1 after the exec and before start returned"
    machine.record("start: exec to READY=1", f"{ready_at - exec_at:.2f} s")
    machine.record("start: systemctl enable --now", f"{returned - before:.2f} s")

    seen: list[tuple[str, str]] = []

    def serving() -> bool:
        now = machine.show("ActiveState", "StatusText")
        seen.append((now["ActiveState"], now["StatusText"]))
        return now["StatusText"].startswith("serving:")

    wait_for(serving, 60, "StatusText serving")
    texts = [text for _, text in seen]
    assert any(t.startswith("starting: sim=starting") for t in [first["StatusText"], *texts]), seen
    assert {state for state, _ in seen} == {"active"}, f"active while the server loads: {seen}"
    assert texts[-1] == "serving: sim=serving"
    assert machine.status() is not None and machine.one_tree()
