"""An idle engine frozen (ranks stopped or in uninterruptible sleep) is told apart from a busy one at the first
failed /health: the ranks probe's state letters, the diagnosis, and the monitor probing /health at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Observation, ProbeSettings, TreeView
from probes.monitor import Monitor
from probes.stacks import observe_ranks

pytestmark = pytest.mark.unit
S = ProbeSettings()  # the product defaults
NOW = 1000.0
TP = ("sglang::scheduler_TP0", "sglang::scheduler_TP1")


def ctx(phase: str = "serving") -> DiagnoseContext:
    return DiagnoseContext(phase, "unified", NOW - 30, S)


def health_503(at: float = NOW, waited: float = 20.0) -> Observation:
    """SGLang's /health giving up after its 20 s timeout."""
    return Observation("health", at, False, "/health 503", waited, {"status": 503})


def ranks_readings(
    start: float, end: float, states: dict[str, str], cpu_moves: bool = False
) -> list[Observation]:
    """The ranks probe once a second from `start` to `end`, every rank in its state letter."""
    out, previous = [], {t: 1.0 for t in states}
    for i in range(int(end - start) + 1):
        cpu = {t: 1.0 + (i + 1 if cpu_moves else 0) for t in states}
        out.append(observe_ranks(TreeView(rank_cpu_s=cpu, rank_states=states), previous, start + i))
        previous = cpu
    return out


def test_a_stopped_rank_with_no_cpu_time_is_frozen_and_a_traced_or_running_one_is_not() -> None:
    """`T`/`D` with CPU time not advancing is frozen; `t` (py-spy reading it), `S`, or `T` with CPU moving is not."""
    tree = TreeView(
        rank_cpu_s={"a": 1.0, "b": 1.0, "c": 1.0, "d": 2.0, "e": 1.0},
        rank_states={"a": "T", "b": "D", "c": "t", "d": "T", "e": "S"},
    )
    obs = observe_ranks(tree, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0}, 5.0)
    assert obs.ok and obs.values["frozen"] == ["a", "b"]
    assert obs.values["states"]["a"] == "T" and "frozen: a=T, b=D" in obs.detail


def test_first_failed_health_with_ranks_frozen_throughout_is_health_unresponsive_with_the_states() -> None:
    """Idle, every rank `T` over the whole 20 s wait of one /health: decided then, well before 120 s."""
    window = [*ranks_readings(NOW - 21, NOW, {t: "T" for t in TP}), health_503()]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "health_unresponsive", fault
    assert fault.evidence["tags"] == ["ranks_frozen"]
    assert fault.evidence["ranks"]["frozen"] == list(TP)
    assert fault.evidence["ranks"]["states"] == {t: "T" for t in TP}
    assert "frozen throughout" in fault.reason and fault.onset_at == NOW - 20


def test_a_busy_or_starved_server_whose_health_fails_is_no_fault() -> None:
    """Ranks running or sleeping (R/S, CPU moving or not) during a failed /health: no early verdict."""
    for states, moves in (
        ({t: "R" for t in TP}, True),
        ({t: "R" for t in TP}, False),
        ({t: "S" for t in TP}, False),
    ):
        window = [*ranks_readings(NOW - 21, NOW, states, cpu_moves=moves), health_503()]
        assert diagnose(window, ctx(), NOW) is None, states


def test_a_freeze_that_began_during_the_health_wait_waits_for_the_next_probe() -> None:
    """Ranks frozen only from 10 s into the /health wait: that /health does not prove the freeze."""
    window = [
        *ranks_readings(NOW - 21, NOW - 11, {t: "S" for t in TP}),
        *ranks_readings(NOW - 10, NOW, {t: "T" for t in TP}),
        health_503(),
    ]
    assert diagnose(window, ctx(), NOW) is None


def test_a_rank_stopped_for_a_moment_is_not_frozen_throughout() -> None:
    """A rank frozen in some readings of the wait and not in others (resumed): no fault."""
    readings = ranks_readings(NOW - 21, NOW, {t: "T" for t in TP})
    readings[10] = observe_ranks(
        TreeView(rank_cpu_s={t: 2.0 for t in TP}, rank_states={t: "R" for t in TP}), {}, readings[10].at
    )
    assert diagnose([*readings, health_503()], ctx(), NOW) is None


def test_frozen_ranks_with_work_in_flight_are_left_to_the_stall_rules() -> None:
    """Requests in flight, every rank frozen through a failed /health: not this rule's (decode_wedge decides)."""
    busy = Observation("progress", NOW, True, "work", None, {"work": True, "stalled_s": 3.0})
    window = [*ranks_readings(NOW - 21, NOW, {t: "T" for t in TP}), health_503(), busy]
    assert diagnose(window, ctx(), NOW) is None


def test_frozen_ranks_while_starting_are_left_to_the_startup_rules() -> None:
    """While starting /health 503 is normal: a frozen rank then is not health_unresponsive."""
    window = [*ranks_readings(NOW - 21, NOW, {t: "T" for t in TP}), health_503()]
    assert diagnose(window, ctx("starting"), NOW) is None


@pytest.fixture
async def health_server() -> AsyncIterator[tuple[list[float], str]]:
    """A /health that answers 200 at once and /metrics idle; the times /health was asked."""
    asked: list[float] = []

    async def health(_: web.Request) -> web.Response:
        asked.append(asyncio.get_running_loop().time())
        return web.Response()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="sglang:num_running_reqs 0\n")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield asked, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_rank_first_seen_frozen_has_health_probed_at_once(
    health_server: tuple[list[float], str],
) -> None:
    """Healthy, then a rank frozen: /health is asked on the next tick, not a health period (10 s) later."""
    asked, url = health_server
    tree: dict[str, Any] = {"states": {t: "S" for t in TP}, "cpu": 1.0}
    monitor = Monitor(
        server="s", role="unified", base_url=url, model="m", settings=ProbeSettings(canary_mode="off"),
        tree=lambda: TreeView(rank_cpu_s={t: tree["cpu"] for t in TP}, rank_states=tree["states"]),
        gpu=None, log_lines=list, pids_for_stacks=dict,
    )  # fmt: skip
    try:
        now = asyncio.get_running_loop().time()
        for i in range(3):  # the first /health (200), then nothing due for a health period
            await monitor.tick(now + i)
            await asyncio.sleep(0.05)
        healthy = len(asked)
        assert healthy >= 1
        tree["states"] = {"sglang::scheduler_TP0": "S", "sglang::scheduler_TP1": "T"}
        for i in range(3, 5):  # two readings: CPU time not advancing, then frozen
            await monitor.tick(now + i)
            await asyncio.sleep(0.05)
        assert len(asked) == healthy + 1, "a /health right after the freeze was seen"
    finally:
        await monitor.aclose()


def stalled_with_stacks(frames: dict[str, str | None], frozen: dict[str, str]) -> list[Observation]:
    """Work stalled for a quarter of the window, stacks taken, the ranks probe showing `frozen` states."""
    progress = Observation(
        "progress", NOW, True, "stall", None,
        {"stalled_s": 6.0, "work_reasons": ["generation_requests_active"], "last_progress_at": NOW - 6.0},
    )  # fmt: skip
    seen = set(frames.values())
    stacks = Observation(
        "stacks", NOW, True, "dumped", 1.0,
        {"ranks": {t: {"collective": c} for t, c in frames.items()}, "diverging": len(seen - {None}) > 1,
         "all_in": next(iter(seen)) if len(seen) == 1 else None},
    )  # fmt: skip
    states = {t: frozen.get(t, "S") for t in frames}
    ranks = observe_ranks(
        TreeView(rank_cpu_s=dict.fromkeys(frames, 1.0), rank_states=states), dict.fromkeys(frames, 1.0), NOW
    )
    return [progress, stacks, ranks]


def test_a_rank_blocked_in_a_collective_while_its_peer_is_frozen_is_a_collective_hang_early() -> None:
    """TP0 in all_reduce, TP1 stopped anywhere (its stack does not vote): collective_hang naming both."""
    window = stalled_with_stacks({TP[0]: "all_reduce", TP[1]: None}, {TP[1]: "T"})
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "collective_hang", fault
    assert fault.evidence["frozen"] == [TP[1]] and "all_reduce" in fault.reason


def test_every_rank_frozen_mid_collective_is_not_a_collective_hang() -> None:
    """Every rank stopped, their stacks in all_reduce: where they stopped, not a wait; the wedge rule decides later."""
    window = stalled_with_stacks({TP[0]: "all_reduce", TP[1]: "all_reduce"}, {TP[0]: "T", TP[1]: "T"})
    assert diagnose(window, ctx(), NOW) is None
