"""The installed daemon as PID 1 of a PID namespace (`unshare --pid --fork --mount-proc`, what an engine gives an
entrypoint without `--init`), watched from the host: every process reaped through ten faults of mixed kinds, then
SIGTERM to PID 1 drains. The engines' tests (test_0*.py) run the image; this one sees every process of the tree
from outside through faults they do not repeat."""

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
