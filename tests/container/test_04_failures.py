"""What ends a container, and what the engine's restart policy then does: a daemon whose status port is taken on
the host network (exit 69), a config error (exit 78), a config the container cannot read."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests.container.engines import Engine
from tests.container.running import CONFIG, Box, config
from tests.support.ports import free_port
from tests.support.wait import wait_for


def restarts(box: Box) -> int:
    return int(box.engine.inspect(box.name)["RestartCount"])


def test_restart_on_failure_restarts_a_container_whose_daemon_keeps_failing(
    engine: Engine, tmp_path: Path
) -> None:
    """The status port taken on the host network: the daemon says so (`daemon.status_bind_failed` with the URL)
    and exits 69; PID 1 does not start it again (nothing of ours can hold the port in a container: a retry fails
    the same way) — one line, one exit — and the container exits 69; with `--restart on-failure` the engine starts
    it again, each start one daemon and one such line."""
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        text = config(host="127.0.0.1", port=port)
        box = Box.run(
            engine,
            tmp_path,
            f"sglsup-failing-{os.getpid()}",
            ["--network", "host", "--restart", "on-failure"],
            text,
        )
        try:
            wait_for(
                lambda: restarts(box) >= 1, 120, "the engine restarting the failed container", interval=0.5
            )
            failed = box.events("daemon.status_bind_failed")
            assert failed and failed[0]["url"] == f"http://127.0.0.1:{port}", failed[:1]
            exits = box.events("init.exit")
            assert exits and {e["status"] for e in exits} == {69}, exits
            starts = box.events(
                "init.daemon_started"
            )  # one per container start (the latest may not have ended)
            assert len(starts) - len(exits) in (0, 1) and not box.events("init.start_limit"), (starts, exits)
        finally:
            box("rm", "-f", check=False)


def test_a_config_error_exits_78_and_on_failure_restarts_it_up_to_its_count(
    engine: Engine, tmp_path: Path
) -> None:
    """A config error is not restarted by PID 1: the container exits 78 at once, naming the bad field. The engine's
    `--restart on-failure:2` restarts it twice, then leaves it `Exited (78)` (the runbook's advice: a count, so a
    config error stops where `ps -a` shows it)."""
    text = config() + "[supervisor.nonsense]\nfield = 1\n"
    box = Box.run(engine, tmp_path, f"sglsup-config-{os.getpid()}", ["--restart", "on-failure:2"], text)
    try:
        wait_for(
            lambda: restarts(box) == 2 and not box.running(), 120, "two restarts, then exited", interval=0.3
        )
        assert int(box.state()["ExitCode"]) == 78
        logs = box.logs()
        assert logs.count(f"{CONFIG}: invalid configuration") == 3, logs[-3000:]
        assert "nonsense" in logs
    finally:
        box("rm", "-f", check=False)


def test_a_config_the_container_cannot_read_exits_78_naming_its_path(engine: Engine, tmp_path: Path) -> None:
    """The config mounted with a mode and owner the container's root cannot read (every capability dropped, as the
    Kubernetes example does): exit 78 and one line naming the path in the container's log."""
    Box.write(tmp_path, config())
    os.chown(tmp_path / "config.toml", 4242, 4242)
    (tmp_path / "config.toml").chmod(0o600)
    box = Box.start(engine, tmp_path, f"sglsup-unreadable-{os.getpid()}", ["--cap-drop", "ALL"])
    try:
        assert box.wait_exited(60, "the container ending") == 78
        lines = [line for line in box.logs().splitlines() if CONFIG in line]
        assert lines and "ermission denied" in lines[-1], box.logs()[-3000:]
    finally:
        box("rm", "-f", check=False)
