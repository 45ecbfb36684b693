"""One tree per server at every instant, decided once: alert-only faults never launch, a launch is refused while
an earlier run lives, and the family's parsers are set before the first launch (fake clock, fake host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.model import Observation
from policies.states import ServerState
from supervisor.host.proctree import ProcId
from supervisor.loop.commands import Command
from tests.unit.loop_fakes import FakeClock, FakeHost, daemon, healthy, running, until

pytestmark = pytest.mark.unit
S = ServerState
QWEN = '[[servers]]\nname = "sim"\ncommand = ["python3", "-m", "simulator.launch_server"]\n'
QWEN_ARGS = 'args = ["--model-path", "Qwen/Qwen2.5-7B-Instruct", "--port", "31999"{extra}]\ngpus = [0]\n'


def leaking(now: float) -> list[Observation]:
    """/health 200, but the tool canary finds raw markup in `content` (no parser)."""
    return [
        Observation("health", now, True, "/health 200", 0.01, {"status": 200}),
        Observation("canary_tool", now, False, "fail: <tool_call> in content", 0.1, {"verdict": "fail"}),
    ]


def qwen(extra: str = "", policy: str = "") -> str:
    return QWEN + QWEN_ARGS.format(extra=extra) + policy


def alive(host: FakeHost) -> int:
    return sum(1 for r in host.runs if r.exit_code is None)


async def test_parser_policy_alert_degrades_the_one_tree_and_never_launches_a_second(tmp_path: Path) -> None:
    """`parser_policy = "alert"` with the parsers missing: degraded and alerted, one tree; stop kills it."""
    host, clock = FakeHost(script=leaking), FakeClock()
    policy = '[servers.policy]\nparser_policy = "alert"\n'
    d = daemon(tmp_path, host, clock, servers=qwen(policy=policy))
    async with running(d) as loop:
        await until(lambda: loop.state is S.DEGRADED)
        for _ in range(50):
            await clock.sleep(1.0)
        assert loop.state is S.DEGRADED and len(host.runs) == 1 and alive(host) == 1
        alert = [i for i in d.svc.incidents.recent if i.fault == "parser_misconfig"]
        assert alert and alert[0].action == "alert" and "policy alert" in alert[0].reason
    assert alive(host) == 0 and loop.state is S.STOPPED


async def test_a_launch_is_refused_while_an_earlier_run_is_alive(tmp_path: Path) -> None:
    """Whatever asks for a launch, a live process of an earlier run is reaped first and journaled: never two trees."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        first = host.run
        host.release_misses = 1  # a release that says "released" but leaves the tree (a bug elsewhere)
        loop.commands.put_nowait(Command("restart", "test", "test"))
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
        refused = [i for i in d.svc.incidents.recent if i.fault == "launch_refused"]
        assert refused and f"pid {first.pid}" in refused[0].reason and refused[0].severity == "page"
        assert first.exit_code is not None and alive(host) == 1
    assert alive(host) == 0


async def test_a_launch_whose_earlier_run_cannot_be_reaped_is_failed_not_doubled(tmp_path: Path) -> None:
    """An earlier run that will not die: failed and paged, nothing launched onto its GPUs; stop leaves nothing."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.release_ok = False
        host.leftovers = [ProcId(7777, 1.0)]
        host.run.exit_code = 1  # a crash: the relaunch must not start beside pid 7777
        await until(lambda: loop.state is S.FAILED)
        for _ in range(20):
            await clock.sleep(1.0)
        assert len(host.runs) == 1
        host.release_ok = True
    assert loop.state is S.STOPPED and alive(host) == 0


async def test_parser_fix_is_applied_before_the_first_launch(tmp_path: Path) -> None:
    """`parser_policy = "fix"` and no parsers in args: the first launch already has them, with a warning entry."""
    host, clock = FakeHost(script=healthy), FakeClock()
    d = daemon(tmp_path, host, clock, servers=qwen())
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        assert len(host.runs) == 1
        assert "--tool-call-parser" in host.run.argv and "qwen" in host.run.argv
        fixed = [i for i in d.svc.incidents.recent if i.action == "fixed before launch"]
        assert fixed and fixed[0].severity == "warning" and "--tool-call-parser is unset" in fixed[0].reason


async def test_an_alias_of_the_expected_parser_is_launched_as_configured(tmp_path: Path) -> None:
    """`--tool-call-parser qwen25` (SGLang's alias of qwen) needs no fix: launched as configured."""
    host, clock = FakeHost(script=healthy), FakeClock()
    d = daemon(tmp_path, host, clock, servers=qwen(extra=', "--tool-call-parser", "qwen25"'))
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        assert host.run.argv[-1] == "qwen25" and loop.rung == 0
        assert not [i for i in d.svc.incidents.recent if i.fault == "parser_misconfig"]


@pytest.mark.parametrize("phase", ["starting", "serving", "backoff", "failed"])
async def test_stop_leaves_nothing_in_every_state(tmp_path: Path, phase: str) -> None:
    """Stopping the daemon while starting, serving, in backoff or failed leaves no process of any run."""
    host, clock = FakeHost(), FakeClock()
    if phase == "starting":
        host.script = lambda now: [Observation("health", now, False, "503", 0.0, {"status": 503})]
    d = daemon(tmp_path, host, clock, restart={"initial_s": 60, "max_s": 60})
    async with running(d) as loop:
        await until(lambda: loop.state in (S.STARTING, S.SERVING) and len(host.runs) == 1)
        if phase in ("serving", "backoff", "failed"):
            await until(lambda: loop.state is S.SERVING)
        if phase == "backoff":  # the first restart of a streak goes at once, the second waits
            host.run.exit_code = 1
            await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
            host.run.exit_code = 1
            await until(lambda: loop.state is S.BACKOFF)
        if phase == "failed":
            host.release_ok = False
            host.run.exit_code = 1
            await until(lambda: loop.state is S.FAILED)
            host.release_ok = True
    assert alive(host) == 0
    assert host.releases[-1].get("any_run_of") == loop.marker
