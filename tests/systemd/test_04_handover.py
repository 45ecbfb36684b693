"""The supervisor's upgrade in place: `sglang-supervisor handover` and the runbook's `systemctl kill -s SIGUSR2`
keep the unit active (through reloading, never failed or activating) with the same MainPID and the same SGLang
main PID, while a client of the server never sees a failure; a newer wheel installed first shows its version
in /status once handed over."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.paths import REPO
from tests.support.wait import wait_for
from tests.systemd.machine import FILES, HOUSE, SUP, Machine

# The runbook's "Restarting the supervisor" table names the signal form of a handover; the test runs it as written.
DOCUMENTED = re.compile(r"`(systemctl kill -s SIGUSR2 [^`]*)`")


@contextmanager
def watched(machine: Machine) -> Iterator[list[tuple[str, str]]]:
    """(ActiveState, MainPID) of the unit, sampled without pause while the block runs."""
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = machine.show("ActiveState", "MainPID")
            seen.append((now["ActiveState"], now["MainPID"]))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=30)


@contextmanager
def client(machine: Machine, name: str) -> Iterator[dict[str, Any]]:
    """A client loop inside the container for the block's duration; its result (sent, failed, errors) after."""
    out = f"/run/{name}"
    machine.sh(f"mkdir -p {out} && systemd-run --unit={name} /usr/bin/python3 {FILES}/client.py {out}")
    wait_for(lambda: machine.run(["test", "-e", f"{out}/started"]).returncode == 0, 30, "the client answered")
    result: dict[str, Any] = {}
    yield result
    machine.sh(f"touch {out}/STOP")
    text = wait_for(
        lambda: machine.sh(f"cat {out}/result.json 2>/dev/null || true"), 30, "the client's result"
    )
    result.update(json.loads(text))


def check(machine: Machine, seen: list[tuple[str, str]], pid: int, result: dict[str, Any]) -> None:
    states = {state for state, _ in seen}
    assert "reloading" in states and states <= {"active", "reloading"}, f"ActiveState seen: {sorted(states)}"
    assert {main for _, main in seen} == {str(pid)}, "the same MainPID throughout"
    assert result["sent"] and result["failed"] == 0, f"the client failed during the handover: {result}"


def test_handover_keeps_the_unit_active_and_the_server_serving(machine: Machine) -> None:
    """`sglang-supervisor handover`: reloading then active, same MainPID, same server PID (adopted), no client error."""
    first = machine.wait_serving()
    pid = machine.main_pid()
    before = machine.status()
    assert before is not None
    with client(machine, "client-handover") as result, watched(machine) as seen:
        started = time.monotonic()
        handover = machine.run([SUP, "handover"], timeout_s=180)
        machine.record(
            "handover: `sglang-supervisor handover` returned after", f"{time.monotonic() - started:.2f} s"
        )
        assert handover.returncode == 0, handover.stdout + handover.stderr
        after = machine.wait_new_daemon(before)
    check(machine, seen, pid, result)
    server = after["servers"][0]
    assert server["pid"] == first["pid"] and server["adopted"]["handover"], server
    assert machine.one_tree()


def test_the_runbooks_sigusr2_hands_over_too(machine: Machine) -> None:
    """The runbook's `systemctl kill -s SIGUSR2 …` (as written there) hands over like the command does."""
    found = DOCUMENTED.search((REPO / "runbook.md").read_text())
    assert found, "the runbook names the signal form of a handover"
    first = machine.wait_serving()
    pid = machine.main_pid()
    before = machine.status()
    assert before is not None
    with client(machine, "client-sigusr2") as result, watched(machine) as seen:
        machine.sh(found.group(1))
        after = machine.wait_new_daemon(before)
    check(machine, seen, pid, result)
    assert after["servers"][0]["pid"] == first["pid"], "the server was not the one adopted"
    assert machine.one_tree()


def test_a_newer_wheel_runs_after_a_handover(machine: Machine) -> None:
    """pip installs the newer wheel over the running one: /status keeps the running version until the handover,
    then shows the new one, with the same server."""
    first = machine.wait_serving()
    before = machine.status()
    assert before is not None
    newer = machine.sh(f"ls {FILES}/*.post1-*.whl").strip()
    version = newer.rsplit("/", 1)[1].split("-")[1]
    machine.sh(f"/opt/sglang-supervisor/venv/bin/pip install --quiet --no-index --find-links {HOUSE} {newer}")
    assert machine.sh(f"{SUP} --version").split()[-1] == version
    still = machine.status()
    assert still is not None and still["version"] == before["version"] != version, (
        "the old program still runs"
    )
    assert machine.run([SUP, "handover"], timeout_s=180).returncode == 0
    after = machine.wait_new_daemon(before)
    assert after["version"] == version and after["pid"] == before["pid"]
    assert after["servers"][0]["pid"] == first["pid"]
    assert machine.prop("ActiveState") == "active"
