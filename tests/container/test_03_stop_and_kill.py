"""One container per engine run without `--stop-timeout` (the engine's default, 10 s), whose server drains for
longer than that: `drain_grace_s = 15` and a request wedged in it when the stop comes (the simulator's
`watchdog_disabled_silent_wedge`), so the drain lasts the whole grace. The tests share it in file order: a
`kill -s KILL` then `start`, the default stop cutting the drain, and the documented timeout letting it finish."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.container.engines import Engine
from tests.container.running import STOP_TIMEOUT_S, Box, config, record
from tests.support.wait import wait_for

DRAIN_GRACE_S = 15  # longer than the engines' default stop timeout
PROBES = {
    "stall_after_s": 600,
    "canary_period_s": 600,
    "stream_canary_period_s": 0,
}  # the wedge is the stop's


@pytest.fixture(scope="module")
def box(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    folder = tmp_path_factory.mktemp(f"{engine.name}-draining")
    text = config(drain_grace_s=DRAIN_GRACE_S, probes=PROBES)
    box = Box.run(engine, folder, f"sglsup-draining-{os.getpid()}", text=text)
    try:
        box.wait_serving()
        yield box
    finally:
        box("rm", "-f", check=False)


def shm_segments(box: Box) -> set[str]:
    return set(box.exec("ls", "/dev/shm").stdout.split())


def wedge_a_request(box: Box) -> subprocess.Popen[bytes]:
    """Arm the silent wedge and send one chat request into it; return once the server counts it running."""
    code, body = box.post_fault({"name": "watchdog_disabled_silent_wedge", "after_requests": 1})
    assert code == 200, body
    body_ = {
        "model": "moonshotai/Kimi-K2.5",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
    }
    client = box.post_in_background("/v1/chat/completions", body_)
    wait_for(box.requests_running, 30, "the wedged request running", interval=0.2)
    return client


def test_kill_then_start_is_a_clean_start_reading_the_old_state(box: Box) -> None:
    """`kill -s KILL` (PID 1 and every process of the container at once, no drain), then `start`: the new daemon
    reads the state the killed one left (its run refused for adoption, `pid gone`, and reaped as an incident),
    starts at once, launches a fresh server with a fresh `/dev/shm` (no segment of the killed run)."""
    before = box.status()
    assert before is not None
    old_run = before["servers"][0]["run_id"]
    old_shm = shm_segments(box)
    assert old_shm, "the running server has its shared-memory segments"
    box("kill", "-s", "KILL")
    assert box.wait_exited(30, "the container killed") == 137
    started = time.monotonic()
    box("start")
    server = box.wait_serving()
    record(f"{box.engine.name}: start after kill -s KILL → serving", f"{time.monotonic() - started:.1f} s")
    assert server["run_id"] != old_run
    refused = box.events("adopt.refused")
    assert refused and refused[-1]["run_id"] == old_run and refused[-1]["reason"] == "pid gone", refused
    assert box.events("recovery.reap_previous")[-1]["run_id"] == old_run
    assert not any(e["fault"] != "adopt_refused" for e in box.events("fault.noticed"))
    assert not shm_segments(box) & old_shm


def test_the_default_stop_timeout_kills_the_container_mid_drain(box: Box) -> None:
    """`stop` with the engine's default timeout while the server drains a request for its whole grace: the
    engine SIGKILLs PID 1 before the daemon has stopped its server (exit 137, no `daemon.stopped`), as the
    runbook warns; nothing of the container is left either way."""
    box.wait_serving()
    client = wedge_a_request(box)
    namespace = box.pid_namespace()
    stopped_before = len(box.events("daemon.stopped"))
    try:
        code, took = box.stop()
    finally:
        client.kill()
        client.wait()
    record(
        f"{box.engine.name}: stop with the default timeout, a {DRAIN_GRACE_S} s drain",
        f"{took:.1f} s, exit {code}",
    )
    assert code == 137, box.logs()[-3000:]
    assert len(box.events("daemon.stopped")) == stopped_before, "the SIGKILL came in the middle of the drain"
    try:
        forwarded = wait_for(lambda: box.events("init.forwarded"), 60, "PID 1's `init.forwarded` in the log")
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{box.logs()[-3000:]}") from None
    assert forwarded[-1]["signal"] == "SIGTERM"
    assert not Box.alive_in(namespace)


def test_the_documented_stop_timeout_lets_the_drain_finish_and_exits_0(box: Box) -> None:
    """After a `start`, the same drain under `stop --time 180`: the daemon waits out the drain grace, kills the
    wedged server, releases its GPUs and stops; PID 1 exits 0 with nothing left."""
    box("start")
    box.wait_serving()
    client = wedge_a_request(box)
    namespace = box.pid_namespace()
    try:
        code, took = box.stop("--time", str(STOP_TIMEOUT_S))
    finally:
        client.kill()
        client.wait()
    record(
        f"{box.engine.name}: stop --time {STOP_TIMEOUT_S}, a {DRAIN_GRACE_S} s drain",
        f"{took:.1f} s, exit {code}",
    )
    assert code == 0, box.logs()[-3000:]
    assert box.events("daemon.stopped")
    assert box.events("init.exit")[-1]["status"] == 0
    assert not box.events("init.leftover")
    assert not Box.alive_in(namespace)
