"""The supervisor core against the simulator: launch, know the tree, stop, reap, release, relaunch."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil

from tests.support.daemon import deployment
from tests.support.procs import holders
from tests.support.wait import wait_for


def serving(s: dict[str, object]) -> bool:
    return s.get("state") == "serving"


def test_demo_config_reaches_serving_and_sigterm_leaves_nothing(tmp_path: Path) -> None:
    """The daemon reaches serving; SIGTERM to it drains the tree, frees the device files and exits 0."""
    with deployment(tmp_path) as dep:
        daemon = dep.start()
        s = dep.wait(serving, what="serving")
        assert s["pid"] and s["gpus"] == [0, 1]
        assert holders(*dep.devices), "the ranks hold their stand-in GPUs while serving"
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        wait_for(lambda: not dep.ours(), 10, "every simulated process gone")
        assert not holders(*dep.devices)


def test_main_killed_is_relaunched(tmp_path: Path) -> None:
    """SIGKILL of the SGLang main process → crash incident, tree replaced, serving again with a new PID."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        os.kill(first["pid"], signal.SIGKILL)
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], what="relaunched")
        assert again["last_incident"]["fault"] in ("crash", "startup_failure")
        assert again["restarts"] >= 1
        old = [p for p in dep.ours() if p.pid == first["pid"]]
        assert not old


def test_rank_killed_is_a_crash_and_the_tree_is_replaced(tmp_path: Path) -> None:
    """One scheduler rank SIGKILLed (main alive: failure F10) → crash detected, whole tree replaced."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        main = psutil.Process(first["pid"])
        rank = next(c for c in main.children(recursive=True) if "scheduler_TP1" in " ".join(c.cmdline()))
        old_pids = {p.pid for p in [main, *main.children(recursive=True)]}
        rank.kill()
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], what="relaunched after rank loss")
        assert again["last_incident"]["fault"] == "crash"
        assert "rank_lost" in str(again["last_incident"]["evidence"])
        assert not old_pids & {p.pid for p in dep.ours()}


def test_orphans_holding_gpus_and_ports_are_reaped(tmp_path: Path) -> None:
    """orphans_hold_gpu_and_ports: ranks detach (setsid); the sweep finds them by marker, nothing is left."""
    env = {"SGLANG_SIM_SCENARIO": "orphans_hold_gpu_and_ports"}
    with deployment(tmp_path, env=env) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        ranks = [p for p in dep.ours() if "sglang::scheduler" in " ".join(p.cmdline())]
        detached = [p for p in ranks if os.getsid(p.pid) != os.getsid(first["pid"])]
        assert detached, "the scenario's ranks run in sessions of their own"
        os.kill(first["pid"], signal.SIGKILL)
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], what="relaunched")
        assert again["state"] == "serving"
        alive = {p.pid for p in dep.ours()}
        assert not alive & {p.pid for p in detached}, "orphans from the first run were killed"
        release = again["last_incident"]["evidence"]["release"]
        killed = {k["pid"]: k["route"] for k in release["killed"]}
        assert {p.pid for p in detached} <= set(killed), "the detached ranks were found and killed"


def test_crash_on_start_backs_off_then_fails_with_an_incident(tmp_path: Path) -> None:
    """A server that dies at every start: growing backoff, then failed with a page-ready incident."""
    restart = {
        "restarts": 3,
        "window_s": 600,
        "initial_s": 0.2,
        "factor": 2,
        "max_s": 5,
        "jitter": 0,
        "slow_retry_s": 0,
    }
    with deployment(tmp_path, extra_args=["--no-such-flag"], restart=restart) as dep:
        dep.start()
        failed = dep.wait(lambda s: s["state"] == "failed", timeout=90, what="failed")
        assert failed["last_incident"]["action"] == "failed"
        assert failed["last_incident"]["fault"] == "startup_failure"
        text = dep.log_tail(400)
        delays = [
            float(line.split("relaunch in ")[1].split("s")[0])
            for line in text.splitlines()
            if "relaunch in " in line
        ]
        assert len(delays) >= 2 and delays == sorted(delays) and delays[-1] > delays[0]


def test_daemon_killed_and_restarted_keeps_exactly_one_tree(tmp_path: Path) -> None:
    """Daemon SIGKILLed while serving, started again → the tree is adopted (the same main PID), exactly one runs."""
    with deployment(tmp_path) as dep:
        daemon = dep.start()
        first = dep.wait(serving, what="serving")
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
        dep.start()
        again = dep.wait(lambda s: serving(s) and bool(s["adopted"]), what="serving under the new daemon")
        assert again["pid"] == first["pid"]
        mains = [p for p in dep.ours() if "simulator.launch_server" in " ".join(p.cmdline())]
        assert [p.pid for p in mains] == [again["pid"]]
