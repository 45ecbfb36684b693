"""The shipped Dockerfile's ENTRYPOINT as PID 1 of a real container (systemd-nspawn without --boot): every
process reaped through ten faults, a crash of the daemon that costs no reload (its init restarts it and it
adopts the still-serving tree), a handover in place, and `docker stop` with the documented timeout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from tests.container.faults import TEN, drive, host_pid, rank_kill
from tests.container.support import DRAINED_TIMEOUT_S, ContainerDeployment
from tests.support.daemon import Traffic, checked
from tests.support.nspawn import nspid
from tests.support.wheel import Installed

PROBES = {"stall_after_s": 4}
RESTART = {"restarts": 20, "initial_s": 0.2, "max_s": 1.0}


def serving(s: dict[str, object]) -> bool:
    return s.get("state") == "serving"


def test_entrypoint_reaps_through_ten_faults_survives_its_own_crash_and_drains(
    tmp_path: Path, installed: Installed
) -> None:
    """In a real container: ten faults leave no zombie and one tree; the daemon SIGKILLed is restarted by PID 1
    and adopts the same SGLang main process while a client sees no failed request; a handover keeps the daemon's
    PID; SIGTERM to PID 1 with the documented timeout drains everything and exits 0."""
    dep = ContainerDeployment(
        tmp_path, tp=4, probes=PROBES, restart=RESTART, installed=installed, runtime="nspawn"
    )
    with checked(dep):
        dep.start()
        assert dep.pid1() is not None and nspid(dep.pid1() or 0)[-1] == 1
        drive(dep, TEN)

        before = dep.wait(serving, 30, "serving")
        daemon = dep.daemon_pid()
        with Traffic(dep.sim_url, dep.model, period_s=0.05) as traffic:
            killed_at = time.monotonic()
            os.kill(daemon, signal.SIGKILL)
            adopted = dep.wait(
                lambda s: serving(s) and bool(s.get("adopted")), 60, "the restarted daemon adopting the tree"
            )
            gap_s = time.monotonic() - killed_at
        assert adopted["pid"] == before["pid"], "the same SGLang main process serves: no reload"
        assert adopted["last_incident"] == before["last_incident"], "no incident"
        assert traffic.sent > 0 and traffic.failed == 0, f"{traffic.failed} of {traffic.sent} requests failed"
        main = host_pid(dep, int(adopted["pid"]))
        assert psutil.Process(main).ppid() == dep.pid1(), "the orphaned SGLang main re-parented to PID 1"
        assert gap_s < 60
        print(f"daemon SIGKILL in a container → adopted in {gap_s:.2f} s; client requests failed: 0")

        rank_kill(dep)
        dep.wait(
            lambda s: serving(s) and s.get("pid") != adopted["pid"], 120, "the adopted tree's crash recovered"
        )
        dep.no_zombies()

        daemon = dep.daemon_pid()
        pid = dep.server()["pid"]
        dep.signal_pid1(signal.SIGUSR2)  # docker kill -s USR2: forwarded by PID 1, a handover in place
        handed = dep.wait(
            lambda s: serving(s) and bool((s.get("adopted") or {}).get("handover")), 60, "handed over"
        )
        assert (dep.daemon_pid(), handed["pid"]) == (daemon, pid)

        code, _ = dep.docker_stop(DRAINED_TIMEOUT_S)
        assert code == 0, dep.log_tail()
        assert dep.log_events("daemon.stopped")
        assert not dep.log_events("init.leftover")
        assert not dep.ours()
