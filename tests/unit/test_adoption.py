"""A restarted daemon adopts its server's running tree when it proves the same, or says why not and relaunches
(fake clock, fake host; the real processes are in tests/e2e/test_adoption.py)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from policies.model import Fault
from policies.plan import Plan
from policies.states import ServerState
from supervisor.daemon import Daemon
from supervisor.loop.commands import Command
from supervisor.loop.server import ServerLoop
from supervisor.records.incident import Incident
from supervisor.records.statefile import StateFile
from tests.unit.loop_fakes import FakeClock, FakeHost, daemon, until

pytestmark = pytest.mark.unit
S = ServerState


async def serve(d: Daemon) -> tuple[ServerLoop, asyncio.Task[None]]:
    loop = d.loops[0]
    task = asyncio.create_task(loop.run_forever())
    await until(lambda: loop.state is S.SERVING)
    return loop, task


async def leave(loop: ServerLoop, task: asyncio.Task[None], handover: bool) -> None:
    """Stop the loop as the daemon does: a handover leaves the run, a stop releases it."""
    loop.stopping, loop.detaching = True, handover
    loop.commands.put_nowait(Command("stop", "test", "test"))
    await asyncio.wait_for(task, timeout=10)


CHANGED = f"""
[[servers]]
name = "sim"
command = ["{sys.executable}", "-m", "simulator.launch_server"]
args = ["--model-path", "Qwen/Qwen3-8B", "--tool-call-parser", "qwen", "--reasoning-parser", "qwen3",
        "--tp-size", "2", "--port", "31999", "--disable-cuda-graph"]
gpus = [0, 1]
"""


def entries(d: Daemon, fault: str) -> list[str]:
    return [i.reason for i in d.svc.incidents.recent if i.fault == fault]


async def test_a_handed_over_run_is_adopted_without_a_launch_or_an_incident(tmp_path: Path) -> None:
    """Handover, then a new daemon: the same run serves again (adopted, said in /status), nothing launched."""
    host, clock = FakeHost(), FakeClock()
    first = daemon(tmp_path, host, clock)
    loop, task = await serve(first)
    await leave(loop, task, handover=True)
    assert host.run.exit_code is None and not host.releases
    second = daemon(tmp_path, host, clock)
    loop, task = await serve(second)
    assert len(host.runs) == 1 and loop.owner.run is host.run
    status = loop.status()
    assert status["adopted"]["handover"] is True and status["pid"] == host.run.pid
    assert not [i for i in second.svc.incidents.recent if i.fault not in ("operator",)]
    await leave(loop, task, handover=False)
    assert host.run.exit_code is not None


async def test_an_adopted_run_is_supervised_a_crash_is_recovered(tmp_path: Path) -> None:
    """After adoption the tree is watched as before: its crash is an incident and a relaunch."""
    host, clock = FakeHost(), FakeClock()
    loop, task = await serve(daemon(tmp_path, host, clock))
    await leave(loop, task, handover=True)
    d = daemon(tmp_path, host, clock)
    loop, task = await serve(d)
    host.run.exit_code = -9
    await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert entries(d, "crash")
    await leave(loop, task, handover=False)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("dead", "gone"),
        ("partial", "a partial tree: sglang::scheduler_TP1 gone"),
        ("foreign", "GPUs held by processes that are not of the run"),
        ("server_info", "/server_info disagrees"),
        ("args", "the launch spec differs from the config (+--disable-cuda-graph)"),
    ],
)
async def test_adoption_is_refused_with_the_reason_and_the_run_replaced(
    tmp_path: Path, case: str, reason: str
) -> None:
    """A run that is not provably the same, whole and alone is reaped and relaunched; the journal says why."""
    host, clock = FakeHost(), FakeClock()
    loop, task = await serve(daemon(tmp_path, host, clock))
    await leave(loop, task, handover=True)
    kw: dict[str, str] = {}
    if case == "dead":
        host.run.exit_code = -9
    elif case == "partial":
        host.run.lost.add("sglang::scheduler_TP1")
    elif case == "foreign":
        host.foreign_gpu = ["pid 99 (python, foreign (user x)) holds /dev/nvidia0"]
    elif case == "server_info":
        host.server_info_problem = "/server_info disagrees with the config: tp_size 4 (config: 2)"
    else:
        kw["servers"] = CHANGED
    d = daemon(tmp_path, host, clock, **kw)
    loop, task = await serve(d)
    refused = entries(d, "adopt_refused")
    assert refused and reason in refused[0], refused
    assert len(host.runs) == 2 and host.runs[0].exit_code is not None and loop.owner.adopted is None
    await leave(loop, task, handover=False)


async def test_a_run_whose_recovery_was_under_way_is_replaced_not_adopted(tmp_path: Path) -> None:
    """The previous daemon died mid-recovery (the tree still alive): the decision stands, the run is replaced and
    the interrupted incident completed."""
    host, clock = FakeHost(), FakeClock()
    first = daemon(tmp_path, host, clock)
    loop, task = await serve(first)
    await leave(loop, task, handover=True)
    record = first.svc.statefile.record("sim")
    incidents = first.svc.incidents
    record.open_incident = incidents.record_fault(incidents.draft_fault(
        "sim", clock.wall(), Fault("decode_wedge", {}, 0.9, "stalled", clock.monotonic()),
        Plan("relaunch", "rung 1"), (), 0, None,
    )).id  # fmt: skip
    first.svc.save_state()
    d = daemon(tmp_path, host, clock)
    loop, task = await serve(d)
    refused = entries(d, "adopt_refused")
    assert refused and "a recovery was under way" in refused[0]
    assert len(host.runs) == 2 and host.runs[0].exit_code is not None
    wedge = [i for i in d.svc.incidents.recent if i.fault == "decode_wedge"][-1]
    assert wedge.recovered_at is not None and "mid-recovery" in wedge.reason
    await leave(loop, task, handover=False)


async def test_a_fault_incident_reaches_the_journal_only_once_the_state_file_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon stopped the moment its journal shows a fault incident is stopped mid-recovery: the state file
    on disk already names that incident (the next daemon completes it instead of leaving its alert open)."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    loop, task = await serve(d)
    journal = d.svc.incidents.journal
    on_disk: dict[str, str] = {}
    append = journal.append

    def seen(incident: Incident) -> None:
        if incident.fault == "crash" and incident.id not in on_disk:
            record = StateFile.load(d.svc.statefile.path).record("sim")
            on_disk[incident.id] = record.open_incident
        append(incident)

    monkeypatch.setattr(journal, "append", seen)
    host.run.exit_code = -9
    await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert on_disk and all(k == v for k, v in on_disk.items()), on_disk
    await leave(loop, task, handover=False)
