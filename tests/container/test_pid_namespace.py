"""The installed daemon as PID 1 of a PID namespace (`unshare --pid --fork --mount-proc`, what a container
without `--init` gives its entrypoint): every process reaped through ten faults, and `docker stop`'s sequence."""

from __future__ import annotations

from pathlib import Path

from tests.container.faults import TEN, drive
from tests.container.support import DRAINED_TIMEOUT_S, ContainerDeployment
from tests.support.daemon import checked
from tests.support.wheel import Installed

PROBES = {"stall_after_s": 4}
RESTART = {"restarts": 20, "initial_s": 0.2, "max_s": 1.0}


def test_pid1_reaps_every_process_through_ten_faults_and_drains_on_sigterm(
    tmp_path: Path, installed: Installed
) -> None:
    """Ten faults at tp 4: after each recovery one tree and no zombie; SIGTERM to PID 1 drains and exits 0."""
    dep = ContainerDeployment(tmp_path, tp=4, probes=PROBES, restart=RESTART, installed=installed)
    with checked(dep):
        dep.start()
        kinds = drive(dep, TEN)
        assert len(kinds) == 10
        reaped = dep.log_events("process.reaped")
        assert reaped, "the daemon reaped the orphaned ranks of the killed trees"
        assert any(r["status"] == -9 for r in reaped), reaped[:5]
        code, _ = dep.docker_stop(DRAINED_TIMEOUT_S)
        assert code == 0, dep.log_tail()
        assert dep.log_events("daemon.stopped"), "the daemon stopped its servers before PID 1 exited"
        assert not dep.log_events("init.leftover"), "nothing outlived the daemon's own stop"
        assert not dep.ours()


def test_sigkill_of_pid1_in_the_middle_of_the_drain_leaves_nothing(
    tmp_path: Path, installed: Installed
) -> None:
    """A stop timeout shorter than the drain (docker's 10 s default against a drain of minutes): the SIGKILL of
    PID 1 mid-drain ends every process of the namespace; nothing holds the GPUs afterwards."""
    dep = ContainerDeployment(tmp_path, tp=2, installed=installed)
    with checked(dep):
        dep.start()
        dep.wait(lambda s: s.get("state") == "serving", 90, "serving")
        code, _ = dep.docker_stop(timeout_s=0.1)
        assert code != 0, "PID 1 was killed, not drained"
        assert not dep.log_events("daemon.stopped"), "the SIGKILL came in the middle of the drain"
        assert not dep.ours(), "the kernel ended the whole namespace with its PID 1"
        assert not dep.namespace_pids()
