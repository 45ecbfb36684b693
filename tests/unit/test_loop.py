"""The server loop with a fake clock and a fake host: transitions, backoff, budget, pause, reload, the gates."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from policies.abort import MAX_ABORTS
from policies.model import Observation
from policies.states import ServerState
from supervisor.daemon import Daemon
from supervisor.host.proctree import ProcId
from supervisor.loop import pd_peers
from supervisor.loop.commands import Command
from tests.unit.loop_fakes import FakeClock, FakeHost, daemon, healthy, running, until

pytestmark = pytest.mark.unit
S = ServerState


def health(now: float, status: int | None) -> Observation:
    return Observation("health", now, status == 200, f"/health {status}", 0.01, {"status": status})


def inconclusive(now: float) -> list[Observation]:
    return [
        health(now, 200),
        Observation(
            "canary_tool", now, False, "inconclusive: finish_reason length", 1.0, {"verdict": "inconclusive"}
        ),
    ]


def incidents(d: Daemon, fault: str | None = None) -> list[dict[str, object]]:
    found = [i.to_json() for i in d.svc.incidents.recent]
    return [i for i in found if fault is None or i["fault"] == fault]


def metric(d: Daemon, line_start: str) -> float:
    for line in d.metrics.render().decode().splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starting {line_start!r}")


async def test_stopped_to_starting_to_serving_when_health_200_and_canary_passes(tmp_path: Path) -> None:
    """A launch is `starting` until /health is 200 and the canaries pass; then `serving`."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        assert loop.reason == "health 200 and canary passed"
    assert len(host.runs) == 1 and host.run.argv[-1] == "31999"


async def test_starting_says_what_it_waits_for(tmp_path: Path) -> None:
    """While the port is closed, status says so instead of a bare `launching`."""
    host, clock = (
        FakeHost(script=lambda now: [Observation("health", now, False, "refused", 0.0, {"refused": True})]),
        FakeClock(),
    )
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: "port closed" in loop.reason)
        assert loop.state is S.STARTING
        assert loop.status()["startup"]["waiting_for"].startswith("/health (port closed")


async def test_starting_to_serving_unproven_after_inconclusive_canaries(tmp_path: Path) -> None:
    """Inconclusive canaries with /health 200 never strand a server: serving unproven, warned, metric 1."""
    host, clock = FakeHost(script=inconclusive), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        assert loop.unproven.startswith("serving unproven: 3 inconclusive canaries")
        assert loop.status()["unproven"] == loop.unproven
        assert metric(d, 'sglang_supervisor_canary_unproven{server="sim"}') == 1.0
        assert incidents(d, "canary_unproven")[0]["severity"] == "warning"
        host.script = healthy
        await until(lambda: not loop.unproven)
        assert metric(d, 'sglang_supervisor_canary_unproven{server="sim"}') == 0.0


async def test_canary_mode_off_serves_on_health_alone(tmp_path: Path) -> None:
    """`canary_mode = "off"`: /health 200 is enough."""
    host, clock = FakeHost(script=lambda now: [health(now, 200)]), FakeClock()
    d = daemon(tmp_path, host, clock, server='[servers.probes]\ncanary_mode = "off"')
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        assert not loop.unproven


async def test_serving_to_recovering_to_backoff_to_serving_after_a_crash(tmp_path: Path) -> None:
    """Main process exit while serving: crash incident, forensics, release, backoff, relaunch, resolved."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    seen: list[ServerState] = []
    d.svc.on_state_change = lambda: seen.append(d.loops[0].state)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.run.exit_code = 1
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert seen[:6] == [S.STARTING, S.SERVING, S.RECOVERING, S.BACKOFF, S.STARTING, S.SERVING]
    crash = incidents(d, "crash")[0]
    assert crash["forensics_path"] and crash["recovered_at"] is not None
    assert host.releases[0]["mode"] == "kill"


async def test_detection_latency_is_observed_for_every_fault(tmp_path: Path) -> None:
    """Regression: the detection-latency histogram was never observed; now each incident feeds it."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.run.exit_code = 1
        await until(lambda: len(host.runs) == 2)
    assert incidents(d, "crash")[0]["detection_latency_s"] is not None
    assert metric(d, 'sglang_supervisor_detection_latency_seconds_count{fault="crash"}') == 1.0


async def test_time_to_serving_means_detection_to_serving_in_metric_and_incident(tmp_path: Path) -> None:
    """Regression: time_to_serving is detection → serving (monotonic) in both the metric and the incident."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.run.exit_code = 1
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    incident = incidents(d, "crash")[0]
    total = metric(d, 'sglang_supervisor_time_to_serving_seconds_sum{server="sim"}')
    assert incident["time_to_serving_s"] == pytest.approx(total)


async def test_rank_crash_after_health_200_is_a_crash_not_a_startup_failure(tmp_path: Path) -> None:
    """A server that answered 200 but never passed its canary, then lost a rank, crashed."""
    host, clock = FakeHost(script=lambda now: [health(now, 200)]), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: "canary" in loop.reason)
        host.run.lost.add("sglang::scheduler_TP1")
        await until(lambda: bool(incidents(d)))
    assert incidents(d)[0]["fault"] == "crash"


async def test_crash_loop_spends_the_budget_then_failed_until_the_operator_restarts(tmp_path: Path) -> None:
    """The first restart goes at once, then backoff grows 1, 2 s; the 4th crash in the window is `failed`."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        for n in range(1, 5):
            await until(lambda n=n: len(host.runs) == n and loop.state is S.SERVING)
            host.run.exit_code = 1
        await until(lambda: loop.state is S.FAILED)
        assert "restart budget spent" in loop.reason
        assert [i["action"] for i in incidents(d, "crash")][-1] == "failed"
        loop.commands.put_nowait(Command("restart", "fixed the host", "alice"))
        await until(lambda: len(host.runs) == 5 and loop.state is S.SERVING)
    delays = [i["reason"] for i in incidents(d, "crash")]
    assert "at once" in delays[0] and "backoff 1.0s" in delays[1] and "backoff 2.0s" in delays[2]


async def test_pause_observes_a_fault_and_resume_acts_on_it(tmp_path: Path) -> None:
    """Paused: a crash is journaled as observed, nothing is killed; resume then recovers."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        loop.commands.put_nowait(Command("pause", "maintenance", "bob"))
        await until(lambda: loop.state is S.PAUSED)
        host.run.lost.add("sglang::scheduler_TP0")
        await until(lambda: bool(incidents(d, "crash")))
        assert incidents(d, "crash")[0]["action"] == "observed (paused)"
        assert host.releases == []
        loop.commands.put_nowait(Command("resume", "done", "bob"))
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert host.releases[0]["mode"] == "kill"


async def test_reload_reaches_the_probes_at_once_and_the_port_at_the_next_launch(tmp_path: Path) -> None:
    """Regression: a reloaded [servers.probes] or --port never reached the probes; now it does."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        new = d.config.model_copy(deep=True)
        server = new.servers[0]
        probes = server.probes.model_copy(update={"stall_after_s": 7.0})
        args = tuple(a if a != "31999" else "31888" for a in server.args)
        new = new.model_copy(update={"servers": [server.model_copy(update={"probes": probes, "args": args})]})
        d.config, d.svc.config = new, new
        loop.reconfigure(new.servers[0])
        assert host.monitors[-1].settings.stall_after_s == 7.0
        assert host.monitors[-1].spec.base_url.endswith(":31999")  # the running server keeps its port
        loop.commands.put_nowait(Command("restart", "apply the new port", "carol"))
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert host.monitors[-1].spec.base_url.endswith(":31888")


async def test_a_wedged_server_loop_stops_the_watchdog(tmp_path: Path) -> None:
    """Regression: WATCHDOG=1 and /healthz followed the daemon's ticker, not the server loops."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    loop = d.loops[0]
    loop.beat()
    assert d.loop_health()[0]
    clock.t += 60  # nothing beat for a minute
    fresh, age = d.loop_health()
    assert not fresh and age >= 60
    loop.busy(120)  # inside a bounded step (a release): not stale
    assert d.loop_health()[0]


async def test_spawn_failure_is_failed_at_once_not_a_crash_loop(tmp_path: Path) -> None:
    """A command that cannot start (a removed venv) is `failed` with the reason; nothing is retried."""
    host, clock = FakeHost(spawn_error="cannot start '/opt/venv/bin/python': No such file"), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.FAILED)
        clock.t += 3600
        for _ in range(50):
            await asyncio.sleep(0)
        assert loop.state is S.FAILED
        assert "operator needed" in loop.reason
    assert len(host.runs) == 0
    assert incidents(d, "startup_failure")[-1]["action"] == "failed"


async def test_release_failure_is_failed_and_paged(tmp_path: Path) -> None:
    """GPUs that will not come free: `failed`, the incident paged, no relaunch onto them."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.release_ok = False
        host.run.exit_code = 1
        await until(lambda: loop.state is S.FAILED)
        assert "release failed" in loop.reason
        assert len(host.runs) == 1
    assert incidents(d, "crash")[0]["severity"] == "page"


STREAM_LEAK = Observation(
    "canary_stream", 0.0, False, "fail: leaks", 1.0, {"verdict": "fail", "leaks": ["<tool_call>"]}
)


async def test_stream_leak_degrades_without_a_restart(tmp_path: Path) -> None:
    """A leak only under concurrent streams: `degraded`, one alert, the tree untouched."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.script = lambda now: [*healthy(now), STREAM_LEAK]
        await until(lambda: loop.state is S.DEGRADED)
        clock.t += 30
        for _ in range(200):
            await asyncio.sleep(0)
        assert host.releases == [] and len(incidents(d, "stream_leak")) == 1


async def test_degraded_ends_when_the_stream_canary_passes_again(tmp_path: Path) -> None:
    """degraded → serving: the leak's canary passes again; the alert-only incident is resolved, nothing restarted."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.script = lambda now: [*healthy(now), STREAM_LEAK]
        await until(lambda: loop.state is S.DEGRADED)
        host.script = lambda now: [
            *healthy(now),
            Observation("canary_stream", now, True, "pass", 1.0, {"verdict": "pass"}),
        ]
        await until(lambda: loop.state is S.SERVING)
        assert loop.reason == "stream_leak cleared: the newest canary passed"
        await until(lambda: incidents(d, "stream_leak")[-1]["recovered_at"] is not None)
        assert host.releases == [] and len(host.runs) == 1


async def test_previous_run_is_reaped_before_the_first_launch(tmp_path: Path) -> None:
    """Processes a dead daemon left (found by marker) are reaped before anything launches."""
    from supervisor.host.proctree import ProcId

    host, clock = FakeHost(leftovers=[ProcId(777, 1.0)]), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
    assert host.releases[0]["any_run_of"] == loop.marker and host.releases[0]["main_pid"] is None


async def test_promote_back_steps_one_rung_up_after_stable_serving(tmp_path: Path) -> None:
    """Promote-back: on a fallback rung, after promote_after_s quiet serving, relaunch one rung lower."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock, server="[servers.policy]\npromote_back = true\npromote_after_s = 60")
    d.loops[0].owner.set_levels({"collective_hang": 1})
    quiet = Observation("progress", 0.0, True, "idle", 0.01, {"work": False})
    host.script = lambda now: [*healthy(now), quiet]
    async with running(d) as loop:
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert loop.owner.levels == {}
    assert incidents(d)[-1]["action"] == "promote" or any(i["action"] == "promote" for i in incidents(d))


async def test_restarts_zero_means_the_first_crash_is_failed(tmp_path: Path) -> None:
    """Edge value: `restarts = 0` allows no restart at all; the first crash is `failed`."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock, restart={"restarts": 0})
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.run.exit_code = 1
        await until(lambda: loop.state is S.FAILED)
        assert len(host.runs) == 1


async def test_slow_retry_relaunches_a_failed_server_after_slow_retry_s(tmp_path: Path) -> None:
    """`slow_retry_s > 0`: a server failed for its budget is retried after that long, not abandoned."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock, restart={"restarts": 0, "slow_retry_s": 1800})
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.run.exit_code = 1
        await until(lambda: loop.state is S.FAILED)
        failed_at = clock.monotonic()
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
        assert clock.monotonic() - failed_at >= 1800 * 0.99


async def test_an_unexpected_error_in_a_step_fails_the_server_and_pages(tmp_path: Path) -> None:
    """A bug or host error inside a step kills what runs, pages `internal_error`, and the loop keeps beating."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)

    async def broken(*args: object, **kw: object) -> str:
        raise RuntimeError("py-spy exploded")

    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.forensics = broken  # type: ignore[method-assign]
        host.run.exit_code = 1
        await until(lambda: loop.state is S.FAILED)
        assert "internal error" in loop.reason
        assert incidents(d, "internal_error")[0]["severity"] == "page"
        assert host.releases and len(host.runs) == 1
        beat = loop.last_beat
        clock.t += 10
        await until(lambda: loop.last_beat > beat)


async def test_an_unwritable_state_dir_is_alerted_once_and_resolved(tmp_path: Path) -> None:
    """A full disk under state_dir: supervision goes on, one `state_unwritable` alert, resolved on recovery."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    journal = d.svc.incidents.journal
    real_append = journal.append

    def full(incident: object) -> None:
        raise OSError(28, "No space left on device")

    journal.append = full  # type: ignore[method-assign]
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.run.exit_code = 1
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
        alerts = incidents(d, "state_unwritable")
        assert len(alerts) == 1 and alerts[0]["recovered_at"] is None
        assert metric(d, 'sglang_supervisor_state_write_failures_total{file="journal"}') >= 2
        journal.append = real_append  # type: ignore[method-assign]
        host.run.exit_code = 1
        await until(lambda: incidents(d, "state_unwritable")[-1]["recovered_at"] is not None)


async def test_a_port_held_by_a_foreign_process_is_named_before_any_launch(tmp_path: Path) -> None:
    """A foreign holder of the server's port: nothing launched, `failed` naming it, a restart relaunches."""
    host, clock = FakeHost(foreign=["pid 4242 (nginx) listens on 127.0.0.1:31999"]), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.FAILED)
        assert host.runs == []
        assert "nginx" in loop.reason and "nginx" in str(incidents(d, "startup_failure")[0]["reason"])
        host.foreign = []
        loop.commands.put_nowait(Command("restart", "port freed", "dave"))
        await until(lambda: loop.state is S.SERVING)


async def test_a_process_that_will_not_die_keeps_the_server_failed_and_its_gpus_unused(
    tmp_path: Path,
) -> None:
    """D state at the host boundary: release fails → failed, paged; a restart re-verifies; no launch until free."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        host.release_ok = False  # a rank in D state survives SIGKILL and keeps /dev/nvidia0 open
        host.run.exit_code = 1
        await until(lambda: loop.state is S.FAILED)
        assert incidents(d, "crash")[0]["severity"] == "page"
        loop.commands.put_nowait(Command("restart", "try again", "erin"))
        await until(lambda: len(host.releases) == 2)
        await until(lambda: loop.state is S.FAILED)
        assert len(host.runs) == 1, "never relaunched onto GPUs that are not verified free"
        host.release_ok = True
        loop.commands.put_nowait(Command("restart", "the rank is gone now", "erin"))
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)


async def test_a_leftover_that_cannot_be_reaped_pages_and_blocks_every_launch_until_it_is_gone(
    tmp_path: Path,
) -> None:
    """A daemon starting over a previous run it cannot reap (a rank in D state): failed, paged, no launch — and an
    operator restart while it is still there verifies again instead of launching onto its GPUs."""
    host, clock = FakeHost(leftovers=[ProcId(4242, 1.0)], release_ok=False), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.FAILED)
        assert loop.reason.startswith("could not reap the previous run")
        assert incidents(d, "release_failed")[0]["severity"] == "page"
        loop.commands.put_nowait(Command("restart", "try again", "erin"))
        await until(lambda: len(host.releases) == 2)
        await until(lambda: loop.state is S.FAILED)
        assert not host.runs, "never launched while the previous run holds its GPUs"
        host.release_ok = True
        loop.commands.put_nowait(Command("restart", "the rank is gone now", "erin"))
        await until(lambda: len(host.runs) == 1 and loop.state is S.SERVING)


async def test_a_daemon_killed_mid_recovery_leaves_one_tree_the_rung_and_a_completed_incident(
    tmp_path: Path,
) -> None:
    """Our own death during forensics: the next daemon reaps by marker, keeps the rung, completes the incident."""
    stuck = asyncio.Event()

    async def hang(*args: object, **kw: object) -> str:
        stuck.set()
        await asyncio.Event().wait()
        return ""

    host, clock = FakeHost(), FakeClock()
    first = daemon(
        tmp_path, host, clock, server="[servers.policy]\nladders = { crash = [['add --disable-cuda-graph']] }"
    )
    loop = first.loops[0]
    task = asyncio.create_task(loop.run_forever())
    await until(lambda: loop.state is S.SERVING)
    host.run.lost.add("sglang::scheduler_TP0")  # the first crash relaunches as is
    await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    host.forensics = hang  # type: ignore[method-assign]
    host.run.lost.add("sglang::scheduler_TP0")  # the second goes one rung down, then we die
    await until(stuck.is_set)
    task.cancel()  # SIGKILL: nothing after this point runs
    with contextlib.suppress(asyncio.CancelledError):
        await task
    leftover = host.run
    again = FakeHost(leftovers=[ProcId(leftover.pid, 1.0)])
    second = daemon(
        tmp_path,
        again,
        clock,
        server="[servers.policy]\nladders = { crash = [['add --disable-cuda-graph']] }",
    )
    async with running(second) as loop2:
        await until(lambda: loop2.state is S.SERVING)
    assert len(again.runs) == 1 and again.releases[0]["any_run_of"] == loop2.marker
    assert "--disable-cuda-graph" in again.runs[0].argv
    crash = [i for i in incidents(second, "crash") if "mid-recovery" in str(i["reason"])]
    assert crash and crash[-1]["recovered_at"] is not None


async def test_ranks_still_spawning_are_not_lost(tmp_path: Path) -> None:
    """A rank that never appeared yet (the load spawns them one by one) is no loss; once it appeared, it is."""
    host, clock = FakeHost(script=lambda now: [health(now, 503)]), FakeClock()
    host.spawning = {"sglang::scheduler_TP1"}
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: len(host.runs) == 1)
        for _ in range(20):
            await clock.sleep(1.0)
        assert loop.state is S.STARTING and not incidents(d)
        host.run.lost.clear()
        await clock.sleep(1.0)
        host.run.lost.add("sglang::scheduler_TP1")
        await until(lambda: bool(incidents(d, "startup_failure")))


PD_PAIR = "".join(
    f"""
[[servers]]
name = "{role}"
role = "{role}"
command = ["{sys.executable}", "-m", "simulator.launch_server"]
args = ["--model-path", "Qwen/Qwen3-8B", "--disaggregation-mode", "{role}", "--port", "{port}"]
gpus = [{gpu}]
"""
    for role, port, gpu in (("decode", 31999, 0), ("prefill", 31998, 1))
)


def blocked_decode(stand_s: float, aborts: int = 0) -> Callable[[float], list[Observation]]:
    """A decode whose pre-allocation queue has stood `stand_s` (nothing waits for KV, nothing runs) through
    `aborts` aborts that freed nothing."""

    def script(now: float) -> list[Observation]:
        values = {"stalled_s": stand_s, "work_reasons": ["generation_requests_active"], "running": 0.0}
        values |= {"pd_queue": 3.0, "pd_waiting": 0.0, "pd_stalled_s": stand_s, "pd_aborts": aborts}
        return [health(now, 200), Observation("progress", now, True, "stalled", 0.01, values)]

    return script


async def test_a_blocked_pre_allocation_queue_is_aborted_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real pair: a prompt too large for the decode's pool blocks its pre-allocation queue with /health 200 — the
    decode's requests are aborted (one incident `abort`), the tree keeps serving, the queue's stand restarts; the
    same stand after MAX_ABORTS aborts that freed nothing: a restart."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock, servers=PD_PAIR)
    # its prefill serves, read just now, idle but for the request waiting for the decode's pre-allocation
    serving = {"stalled_s": 30.0, "pd_queue": 1.0, "pd_waiting": 1.0, "running": 0.0}
    monkeypatch.setattr(
        pd_peers, "prefills", lambda *_: (Observation("progress", clock.t, True, "waiting", 0.01, serving),)
    )
    async with running(d, "decode") as loop:
        await until(lambda: loop.state is S.SERVING)
        runs, launch = len(host.runs), host.monitors[-1]

        def stand(now: float) -> list[Observation]:  # 30 s, counted afresh from an abort: never drained
            if host.monitors[-1] is not launch:
                return healthy(now)  # the relaunch serves
            restarts = launch.pd_lease_restarts
            return blocked_decode(now - restarts[-1] if restarts else 30.0, len(restarts))(now)

        host.script = stand
        await until(lambda: len(host.aborts) == 1)
        assert host.aborts == ["http://127.0.0.1:31999"] and len(host.runs) == runs
        assert [i["action"] for i in incidents(d, "pd_transfer_wedge")] == ["abort"]
        assert loop.state is S.SERVING and host.monitors[-1].pd_lease_restarts
        await until(lambda: len(host.runs) == runs + 1)
        assert (
            len(host.aborts) == MAX_ABORTS and incidents(d, "pd_transfer_wedge")[-1]["action"] == "relaunch"
        )


ROUTED_UNIFIED = f"""
[[servers]]
name = "sim"
command = ["{sys.executable}", "-m", "simulator.launch_server"]
args = ["--model-path", "Qwen/Qwen3-8B", "--port", "31999"]
gpus = [0]
[[servers]]
name = "router"
role = "router"
command = ["{sys.executable}", "-m", "sglang_router.launch_router"]
args = ["--worker-urls", "http://127.0.0.1:31999", "--port", "31990"]
"""


async def test_a_router_waits_for_its_workers_without_an_alert(tmp_path: Path) -> None:
    """A router answers /health 200 before its workers load: it serves unproven, with no alert, until one of the
    config's workers is up; its canary through it then proves it."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock, servers=ROUTED_UNIFIED)
    host.scripts["router"] = inconclusive
    async with running(d, "router") as loop:
        await until(lambda: loop.state is S.SERVING)
        assert loop.owner.unproven == "serving unproven: awaiting a unified server with /health 200 behind it"
        assert not incidents(d, "canary_unproven")
        host.scripts["router"] = healthy
        await until(lambda: not loop.owner.unproven)
