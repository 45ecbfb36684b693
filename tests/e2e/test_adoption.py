"""The supervisor's own restart costs no serving time: a SIGKILLed or handed-over daemon's successor adopts the
simulated server (a slow load, so a reload would show), keeps supervising it, and refuses — saying why — a run it
cannot prove the same, whole and alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import procs
from tests.support.daemon import ROOT, Deployment, Traffic, deployment

SLOW_LOAD = {"SGLANG_SIM_STARTUP_S": "6"}


def serving(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving"


def kill_daemon(dep: Deployment) -> None:
    """SIGKILL the daemon alone (as the OOM killer or systemd's watchdog would), leaving its server."""
    assert dep.daemon is not None
    os.killpg(dep.daemon.pid, signal.SIGKILL)
    dep.daemon.wait(timeout=10)


def journal(dep: Deployment, fault: str) -> list[dict[str, Any]]:
    return [i for i in dep.status()["incidents"] if i["fault"] == fault]


def test_a_sigkilled_daemon_is_followed_by_one_that_adopts_the_serving_tree(tmp_path: Path) -> None:
    """SIGKILL of the daemon while serving under traffic: the next daemon serves the same main PID (adopted,
    no incident, client requests answered), and still supervises it (a rank kill is recovered)."""
    with deployment(tmp_path, env=SLOW_LOAD) as dep:
        dep.start()
        first = dep.wait(serving, timeout=90, what="serving")
        with Traffic(dep.sim_url, dep.model, period_s=0.2) as traffic:
            kill_daemon(dep)
            dep.start()
            again = dep.wait(lambda s: serving(s) and bool(s["adopted"]), timeout=60, what="adopted")
        assert again["pid"] == first["pid"] and again["adopted"]["handover"] is False
        assert traffic.failed == 0 and traffic.sent > 0
        assert not [i for i in dep.status()["incidents"] if i["fault"] not in ("operator",)]
        rank = next(p for p in procs.ours(dep.sim) if "scheduler_TP1" in procs.title(p))
        rank.kill()
        after = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=90, what="recovered")
        assert after["last_incident"]["fault"] == "crash" and not after["adopted"]


def test_handover_under_traffic_keeps_the_server_and_the_pid(tmp_path: Path) -> None:
    """`sglang-supervisor handover`: the daemon re-executes itself (same PID), the server keeps serving its
    clients and is adopted."""
    with deployment(tmp_path, env=SLOW_LOAD) as dep:
        daemon = dep.start()
        first = dep.wait(serving, timeout=90, what="serving")
        with Traffic(dep.sim_url, dep.model, period_s=0.2) as traffic:
            done = subprocess.run(
                [sys.executable, "-m", "supervisor.cli", "handover", "--url", dep.url, "--timeout", "60"],
                cwd=ROOT, capture_output=True, text=True, timeout=90, check=False,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr + dep.log_tail()
        now = dep.server()
        assert now["pid"] == first["pid"] and now["adopted"]["handover"] is True
        assert dep.status()["pid"] == daemon.pid and daemon.poll() is None
        assert traffic.failed == 0 and traffic.sent > 0


def _tamper_start_time(dep: Deployment) -> None:
    path = dep.root / "state" / "state.json"
    state = json.loads(path.read_text())
    state["servers"][dep.name]["identity"]["start_ticks"] += 1
    path.write_text(json.dumps(state))


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("args", "the launch spec differs from the config (+--disable-cuda-graph)"),
        # SGLang's main process tears itself down a few seconds after a rank dies: the next daemon finds the
        # tree partial, or the main process gone already
        ("partial", ("a partial tree: sglang::scheduler_TP1 gone", "pid gone")),
        ("start_time", "start time differs"),
        ("foreign_holder", "GPUs held by processes that are not of the run"),
    ],
)
def test_adoption_is_refused_and_the_server_replaced(
    tmp_path: Path, case: str, reason: str | tuple[str, ...]
) -> None:
    """A run changed behind the dead daemon's back is not adopted: the journal says why, it is reaped and
    relaunched (a new main PID), and nothing of it is left."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(serving, timeout=90, what="serving")
        kill_daemon(dep)
        holder = None
        if case == "args":
            dep.extra_args = ["--disable-cuda-graph"]
            dep.write()
        elif case == "partial":
            next(p for p in procs.ours(dep.sim) if "scheduler_TP1" in procs.title(p)).kill()
        elif case == "start_time":
            _tamper_start_time(dep)
        else:
            holder = subprocess.Popen(
                [sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(120)",
                 str(dep.devices[0])],
            )  # fmt: skip
        try:
            dep.start()
            after = dep.wait(
                lambda s: s["pid"] not in (None, first["pid"]) or s["state"] == "failed",
                timeout=90,
                what="replaced",
            )
            refused = journal(dep, "adopt_refused")
            reasons = (reason,) if isinstance(reason, str) else reason
            assert refused and any(r in refused[0]["reason"] for r in reasons), (refused, dep.log_tail())
            if holder is None:
                assert serving(dep.wait(serving, timeout=90, what="serving again"))
            else:  # a foreign process on its GPU: the release cannot free it, nothing is launched beside it
                assert after["state"] == "failed" and after["pid"] is None
        finally:
            if holder is not None:
                holder.kill()
                holder.wait(timeout=10)
