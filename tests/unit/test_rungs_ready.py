"""Rung requests are checked before they reach a loop; readiness is read from the owners' state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from policies.ladders import DEFAULT_LADDERS
from policies.model import Observation
from policies.states import ServerState
from supervisor.loop.commands import Command, RungChange
from supervisor.reporting.readiness import overall, verdict
from supervisor.rungs import RungRefused, check_rung, parse_request, show_lines
from tests.unit.loop_fakes import FakeClock, FakeHost, daemon, until

pytestmark = pytest.mark.unit
S = ServerState


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"action": "show", "server": "kimi"}, "'set' or 'reset'"),
        ({"action": "set", "ladder": "oom", "level": 1}, "server: a server's name is required"),
        ({"action": "set", "server": "kimi", "level": 1}, "set needs ladder"),
        ({"action": "set", "server": "kimi", "ladder": "oom", "level": "2"}, "set needs ladder"),
        ({"action": "reset", "server": "kimi", "restart": "yes"}, "restart: got 'yes'"),
    ],
)
def test_a_malformed_rung_request_is_refused_naming_the_field(body: dict[str, object], message: str) -> None:
    """Each malformed body is refused with the field and what is allowed."""
    with pytest.raises(RungRefused, match=message):
        parse_request(body)


def test_a_reset_without_a_ladder_means_every_ladder() -> None:
    """`reset` without `ladder` is level 0 for every active ladder."""
    assert parse_request({"action": "reset", "server": "kimi"}) == ("kimi", RungChange(None, 0, False))


@pytest.mark.parametrize(
    ("role", "change", "group", "message"),
    [
        (
            "unified",
            RungChange("nope", 1),
            False,
            "'nope' is not a ladder of kimi; its ladders: collective_hang",
        ),
        ("unified", RungChange("collective_hang", 4), False, "level: got 4; collective_hang has 3 rung"),
        ("unified", RungChange("collective_hang", -1), False, "level: got -1"),
        ("router", RungChange("collective_hang", 1), False, "router"),
        ("unified", RungChange("collective_hang", 1), True, "group"),
    ],
)
def test_a_rung_that_cannot_apply_is_refused(
    role: str, change: RungChange, group: bool, message: str
) -> None:
    """Unknown ladder, a level beyond the ladder, a router, a group member: refused with why."""
    with pytest.raises(RungRefused, match=message):
        check_rung("kimi", role, DEFAULT_LADDERS, change, group)
    check_rung("kimi", "unified", DEFAULT_LADDERS, RungChange("collective_hang", 3), False)


def test_rung_show_marks_the_rungs_in_force() -> None:
    """`rung show` lists every ladder with its level and marks the rungs in force."""
    server = {
        "name": "kimi",
        "state": "serving",
        "fallback": {"levels": {"oom": 1}, "ladders": {"oom": ["step a", "step b"]}},
        "next_launch": {"pending": False},
    }
    assert show_lines(server) == ["kimi: serving", "  oom: rung 1 of 2", "    * 1: step a", "      2: step b"]


@pytest.mark.parametrize(
    ("state", "unproven", "stale", "ready", "says"),
    [
        ("serving", "", None, True, "kimi ready: serving and proven"),
        ("serving", "serving unproven: 3 inconclusive canaries", None, False, "serving unproven"),
        ("degraded", "", None, False, "kimi not ready: degraded: leak"),
        ("recovering", "", None, False, "kimi not ready: recovering: leak"),
        ("paused", "", None, False, "not ready: paused"),
        ("serving", "", 12.0, False, "loop has not beaten for 12 s"),
    ],
)
def test_readiness_is_serving_and_proven(
    state: str, unproven: str, stale: float | None, ready: bool, says: str
) -> None:
    """Ready only when serving, proven and its loop beating; otherwise one line saying why."""
    found = verdict("kimi", state, "leak\nin content", unproven, 1.7e9, stale)
    assert found.ready is ready and says in found.line and "\n" not in found.line


def test_the_host_is_ready_only_when_every_server_is() -> None:
    """`/ready`: every server ready, else the lines of those that are not."""
    a = verdict("a", "serving", "", "", 1.7e9, None)
    b = verdict("b", "starting", "loading", "", 1.7e9, None)
    assert overall([a, a])[0] is True
    assert overall([a, b]) == (False, "b not ready: starting: loading")


async def test_readiness_follows_the_owner_without_a_probe(tmp_path: Path) -> None:
    """A served, proven server is ready; unproven it is not; an unknown name is a KeyError."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    loop = d.loops[0]
    task = asyncio.create_task(loop.run_forever())
    try:
        assert d.readiness("sim")[0].ready is False
        await until(lambda: loop.state is S.SERVING)
        probes = len(host.monitors[-1].observations)
        assert d.readiness(None)[0].ready is True
        assert len(host.monitors[-1].observations) == probes
        host.script = lambda now: [
            Observation("health", now, True, "/health 200", 0.01, {"status": 200}),
            Observation("canary_tool", now, False, "inconclusive", 1.0, {"verdict": "inconclusive"}),
        ]
        loop.set_unproven("serving unproven: the canary is inconclusive")
        assert d.readiness("sim")[0].ready is False
        with pytest.raises(KeyError):
            d.readiness("other")
        with pytest.raises(KeyError):
            await d.control_rung("other", RungChange(None, 0), "", "t")
    finally:
        loop.stopping = True
        loop.commands.put_nowait(Command("stop", "test over", "test"))
        await asyncio.wait_for(task, timeout=10)
