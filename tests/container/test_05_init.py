"""`run --init`: the engine's own init (docker's tini, podman's catatonit) as PID 1, the supervisor its child.

What still holds: the daemon reaps its orphaned ranks as a subreaper and `stop` drains. What is lost, and why the
runbook says not to use `--init`: a daemon that dies ends the container, and SGLang with it (PID 1 restarts it in
place without `--init`, tests/container/test_02_serving.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.container.engines import Engine
from tests.container.running import STOP_TIMEOUT_S, Box, record
from tests.support.wait import wait_for

INITS = {"docker": "docker-init", "podman": "/run/podman-init"}  # tini; catatonit, mounted there


@pytest.fixture(scope="module")
def box(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    folder = tmp_path_factory.mktemp(f"{engine.name}-init")
    box = Box.run(
        engine, folder, f"sglsup-init-{os.getpid()}", ["--init", "--stop-timeout", str(STOP_TIMEOUT_S)]
    )
    try:
        box.wait_serving()
        yield box
    finally:
        box("rm", "-f", check=False)


def test_with_init_the_supervisor_is_not_pid_1_and_reaps_orphaned_ranks_as_a_subreaper(box: Box) -> None:
    """PID 1 is the engine's init; `sglang-supervisor run` is its child and is the daemon itself (no init of its
    own). The SGLang main SIGKILLed: its ranks re-parent to the daemon, which reaps them (`process.reaped`) and
    serves again from a new main; no zombie is left."""
    rows = {pid: (ppid, args) for pid, ppid, args in box.processes()}
    assert INITS[box.engine.name] in rows[1][1], rows[1]
    status = box.status()
    assert status is not None
    daemon = int(status["pid"])
    assert rows[daemon][0] == 1 and "sglang-supervisor run" in rows[daemon][1], rows
    main = status["servers"][0]["pid"]
    box.exec("kill", "-9", str(main))
    box.wait_server(lambda s: s["state"] == "serving" and s["pid"] != main, 90, "serving from a new main")
    assert box.events("process.reaped"), "the daemon reaped the orphaned ranks of the killed main"
    states = box.exec("ps", "-e", "-o", "stat=").stdout.split()
    assert not [s for s in states if s.startswith("Z")], states


def test_with_init_stop_still_drains_and_exits_0(box: Box) -> None:
    """`stop`: the engine's init passes SIGTERM to the supervisor, which stops its servers; exit 0, nothing left."""
    namespace = box.pid_namespace()
    code, took = box.stop()
    record(f"{box.engine.name}: stop of a serving container run with --init", f"{took:.1f} s")
    assert code == 0, box.logs()[-3000:]
    assert box.events("daemon.stopped")
    assert not Box.alive_in(namespace)


def test_with_init_a_daemon_that_dies_ends_the_container_and_sglang_with_it(box: Box) -> None:
    """Started again, serving, the daemon SIGKILLed: nobody restarts it; the init exits with its status and the
    whole container ends, SGLang's tree included: a full reload where, without `--init`, PID 1 restarts the daemon
    and it adopts the server."""
    box("start")
    status = box.wait_serving() and box.status()
    assert status is not None
    namespace = box.pid_namespace()
    killed = time.monotonic()
    box.exec("kill", "-9", str(status["pid"]))
    code = box.wait_exited(30, "the container ending with its daemon")
    record(
        f"{box.engine.name}: --init, daemon SIGKILL → the container ended",
        f"{time.monotonic() - killed:.1f} s",
    )
    assert code == 137
    wait_for(lambda: not Box.alive_in(namespace), 10, "no process of the container left")
