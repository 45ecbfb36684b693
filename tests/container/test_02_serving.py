"""One container of the image per engine, run as the README says (`run -d --stop-timeout 180`, the config and the
token mounted read-only), serving the simulator, driven only through the engine's CLI and the status port. The
tests share it in file order; the last one stops it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from tests.container.engines import Engine
from tests.container.running import ENTRYPOINT, STOP_TIMEOUT_S, TOKEN, Box, record
from tests.support.wait import wait_for

HEALTH = ["--health-interval", "1s"]  # the image's check command and timeout; only asked every second


@pytest.fixture(scope="module")
def box(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    folder = tmp_path_factory.mktemp(f"{engine.name}-serving")
    options = ["--stop-timeout", str(STOP_TIMEOUT_S), *(HEALTH if engine.name == "docker" else [])]
    started = time.monotonic()
    box = Box.run(engine, folder, f"sglsup-serving-{os.getpid()}", options)
    try:
        box.wait_serving()
        record(f"{engine.name}: run → serving", f"{time.monotonic() - started:.1f} s")
        yield box
    finally:
        box("rm", "-f", check=False)


def test_the_supervisor_is_pid_1_and_serves_with_healthz_and_ready_answering(box: Box) -> None:
    """`ps` inside: PID 1 is the image's ENTRYPOINT, the daemon its child, SGLang (the simulator) the daemon's;
    `/healthz`, `/ready` and `/servers/sim/ready` answer 200 on the status port."""
    pid1 = box.exec("cat", "/proc/1/cmdline").stdout.rstrip("\0").split("\0")
    assert pid1[-len(ENTRYPOINT) :] == ENTRYPOINT, f"PID 1 is {pid1}, not the supervisor: signals go to it"
    rows = {pid: (ppid, args) for pid, ppid, args in box.processes()}
    status = box.status()
    assert status is not None
    daemon = int(status["pid"])
    assert rows[daemon][0] == 1, "the daemon is PID 1's child"
    main = int(status["servers"][0]["pid"])
    assert rows[main][0] == daemon and "simulator.launch_server" in rows[main][1]
    for path in ("/healthz", "/ready", "/servers/sim/ready"):
        code, body = box.get(path)
        assert code == 200, (path, code, body)


def test_health_status_turns_healthy_then_unhealthy_when_the_supervisor_stops_answering(box: Box) -> None:
    """The engine runs the image's HEALTHCHECK: `healthy` while the daemon answers `/healthz`; the daemon stopped
    (SIGSTOP) → `unhealthy`; continued → `healthy` again. The daemon, not SGLang: the server kept serving."""
    if box.engine.name == "podman":
        pytest.skip("podman runs HEALTHCHECK from systemd timers, and there is no systemd here")
    wait_for(lambda: box.engine.health(box.name) == "healthy", 60, "healthy")
    daemon = str(box.status()["pid"])  # type: ignore[index]
    box.exec("kill", "-STOP", daemon)
    try:
        stopped = time.monotonic()
        wait_for(lambda: box.engine.health(box.name) == "unhealthy", 90, "unhealthy")
        record(f"{box.engine.name}: daemon stopped → unhealthy", f"{time.monotonic() - stopped:.1f} s")
    finally:
        box.exec("kill", "-CONT", daemon)
    wait_for(lambda: box.engine.health(box.name) == "healthy", 60, "healthy again")
    assert box.wait_serving()["state"] == "serving"


def test_logs_show_the_supervisors_json_lines_and_no_sglang_output(box: Box) -> None:
    """`logs`: every line is one of the supervisor's JSON lines (PID 1's `init.*` and the daemon's); SGLang's own
    output goes to its log file under the log directory, not to the container's log."""
    lines = [line for line in box.logs().splitlines() if line.strip()]
    events = []
    for line in lines:
        record_ = json.loads(line)
        assert isinstance(record_, dict) and "event" in record_, line
        events.append(record_["event"])
    assert "init.daemon_started" in events and "daemon.started" in events
    listing = box.exec("sh", "-c", "cat /var/log/sglang-supervisor/sim*.log").stdout
    assert "Uvicorn running" in listing or "The server is fired up" in listing, listing[-2000:]


def test_exec_status_handover_and_restart_work_as_on_a_host(box: Box) -> None:
    """`exec NAME sglang-supervisor status`, `handover` (the daemon re-executed in place: same PID, same SGLang
    main), and `restart --server sim --token-file …` (a new SGLang main), with the image's defaults for the URL."""
    shown = box.exec("sglang-supervisor", "status").stdout
    assert "sim" in shown and "serving" in shown, shown
    before = box.status()
    assert before is not None
    main = before["servers"][0]["pid"]
    box.exec("sglang-supervisor", "handover", timeout_s=120)
    handed = box.wait_server(
        lambda s: s["state"] == "serving" and bool((s.get("adopted") or {}).get("handover")),
        60,
        "handed over",
    )
    after = box.status()
    assert after is not None and (after["pid"], handed["pid"]) == (before["pid"], main)
    box.exec("sglang-supervisor", "restart", "--server", "sim", "--token-file", TOKEN)
    box.wait_server(lambda s: s["state"] == "serving" and s["pid"] != main, 90, "a new SGLang main serving")


def test_a_daemon_killed_inside_is_restarted_by_pid_1_and_adopts_the_same_sglang_main(box: Box) -> None:
    """`exec NAME kill -9 <daemon>`: PID 1 starts a new daemon, which adopts the still-serving SGLang main (same
    PID, no reload)."""
    before = box.status()
    assert before is not None
    main = before["servers"][0]["pid"]
    killed = time.monotonic()
    box.exec("kill", "-9", str(before["pid"]))

    def adopted() -> dict[str, object] | None:
        now = box.status()
        if now is None or now["pid"] == before["pid"]:
            return None
        server = now["servers"][0]
        return server if server["state"] == "serving" and server.get("adopted") else None

    server = wait_for(adopted, 60, "a new daemon serving the adopted SGLang main", interval=0.2)
    record(f"{box.engine.name}: daemon SIGKILL → adopted, serving", f"{time.monotonic() - killed:.1f} s")
    assert server["pid"] == main
    assert box.events("init.daemon_exited")[-1]["status"] == -9


def test_stop_with_the_documented_timeout_drains_and_exits_0_with_nothing_left(box: Box) -> None:
    """`stop` of the container run with `--stop-timeout 180`: SIGTERM forwarded, every server stopped by the
    daemon, PID 1 exits 0 well within the timeout, and no process of the container is left."""
    namespace = box.pid_namespace()
    code, took = box.stop()
    record(
        f"{box.engine.name}: stop (--stop-timeout {STOP_TIMEOUT_S}) of a serving container", f"{took:.1f} s"
    )
    assert code == 0, box.logs()[-3000:]
    assert box.events("daemon.stopped")
    assert box.events("init.exit")[-1]["status"] == 0
    assert not box.events("init.leftover")
    assert not Box.alive_in(namespace)
    assert took < STOP_TIMEOUT_S
