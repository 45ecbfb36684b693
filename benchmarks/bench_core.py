"""Supervisor-core figures, the daemon running a simulated server as an operator would run it.

(a) exit → relaunch: SIGKILL the SGLang main process of a serving tp-2 server; seconds until `/status` shows a
    new main PID (the relaunch was spawned) and until it is serving again. The restart backoff is set to 0 so
    the figure is the mechanics (notice, reap, verify free, spawn); the product's default first backoff is 5 s.
(b) tp-8 tree → GPUs verified free: SIGKILL the main process of an 8-rank tree; seconds until no process of the
    killed tree holds a stand-in device file and none of the PIDs listed in `nvml.json` is alive. Two variants:
    `attached` (the ranks die with their parent, as SGLang's do) and `detached` (orphans_hold_gpu_and_ports:
    the ranks run in sessions of their own and only the supervisor's reaper frees the GPUs).
(c) the daemon's own footprint while serving: RSS and CPU %, sampled once a second with psutil.

Run: ``.venv/bin/python -m benchmarks.bench_core [--quick]``.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from functools import partial
from typing import Any

import psutil

from benchmarks.common import bench_deployment, parser, say, serving, summary, wait_for, write_result
from tests.support.daemon import Deployment
from tests.support.procs import holders

NO_BACKOFF = {"initial_s": 0, "jitter": 0, "restarts": 10000, "window_s": 600}
WAIT_S = 60.0


def relaunch(samples: int) -> dict[str, Any]:
    """(a) SIGKILL main of a serving tp-2 server, `samples` times."""
    spawned: list[float] = []
    back: list[float] = []
    with bench_deployment(restart=NO_BACKOFF) as dep:
        dep.start()
        cur = dep.wait(serving, timeout=120, what="serving")
        for i in range(samples):
            say(f"core: relaunch {i + 1}/{samples}")
            old = int(cur["pid"])
            t0 = time.monotonic()
            os.kill(old, signal.SIGKILL)
            new = wait_for(partial(_new_pid, dep, old), WAIT_S, interval=0.02)
            t_new = time.monotonic()
            nxt = wait_for(partial(_serving_other, dep, old), WAIT_S, interval=0.05)
            if new is None or nxt is None:
                break
            spawned.append(t_new - t0)
            back.append(time.monotonic() - t0)
            cur = nxt
    return {"tp": 2, "kill_to_new_pid_s": summary(spawned), "kill_to_serving_s": summary(back)}


def _new_pid(dep: Deployment, old: int) -> int | None:
    pid = dep.server().get("pid")
    return int(pid) if pid and int(pid) != old else None


def _serving_other(dep: Deployment, old: int) -> dict[str, Any] | None:
    s = dep.server()
    return s if serving(s) and s.get("pid") and int(s["pid"]) != old else None


def release(samples: int, detached: bool) -> dict[str, Any]:
    """(b) SIGKILL main of a tp-8 tree; time until its processes hold no device and nvml lists none alive."""
    times: list[float] = []
    env = {"SGLANG_SIM_SCENARIO": "orphans_hold_gpu_and_ports"} if detached else {}
    for i in range(samples):
        say(f"core: tp-8 release ({'detached' if detached else 'attached'}) {i + 1}/{samples}")
        with bench_deployment(tp=8, env=env, restart=NO_BACKOFF) as dep:
            dep.start()
            first = dep.wait(serving, timeout=120, what="serving")
            main = psutil.Process(int(first["pid"]))
            tree = {main.pid, *(c.pid for c in main.children(recursive=True))}
            tree |= holders(*dep.devices)
            wait_for(partial(_listed, dep, tree), 10)
            t0 = time.monotonic()
            os.kill(main.pid, signal.SIGKILL)
            freed = wait_for(partial(_tree_free, dep, tree), WAIT_S, interval=0.02)
            if freed:
                times.append(time.monotonic() - t0)
    return {"tp": 8, "ranks_detached": detached, "kill_to_verified_free_s": summary(times)}


def _nvml_pids(dep: Deployment) -> set[int]:
    data = json.loads((dep.sim / "nvml.json").read_text())
    return {int(p) for g in data.get("gpus", []) for p in g.get("pids", [])}


def _listed(dep: Deployment, tree: set[int]) -> bool:
    return len(_nvml_pids(dep) & tree) >= 8


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree_free(dep: Deployment, tree: set[int]) -> bool:
    if holders(*dep.devices) & tree:
        return False
    return not any(_alive(p) for p in _nvml_pids(dep) & tree)


def footprint(window_s: float) -> dict[str, Any]:
    """(c) The daemon process's RSS and CPU % while it supervises a serving tp-2 server."""
    with bench_deployment() as dep:
        daemon = dep.start()
        dep.wait(serving, timeout=120, what="serving")
        proc = psutil.Process(daemon.pid)
        proc.cpu_percent(None)
        rss: list[float] = []
        cpu: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < window_s:
            time.sleep(1.0)  # the sampling period
            cpu.append(proc.cpu_percent(None))
            rss.append(proc.memory_info().rss / 2**20)
        state = dep.server()["state"]
    return {
        "window_s": window_s,
        "samples": len(rss),
        "state": state,
        "rss_mib": {"median": round(statistics.median(rss), 1), "max": round(max(rss), 1)},
        "cpu_percent": {"mean": round(statistics.fmean(cpu), 2), "max": round(max(cpu), 1)},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (a), (b), (c) and print the figures."""
    args = parser(__doc__).parse_args(argv)
    n_exit, n_release, window = (5, 2, 15.0) if args.quick else (20, 5, 60.0)
    report: dict[str, Any] = {"quick": args.quick}
    try:
        report["relaunch"] = relaunch(n_exit)
        report["release_attached"] = release(n_release, detached=False)
        report["release_detached"] = release(n_release, detached=True)
        report["footprint"] = footprint(window)
    except (AssertionError, OSError, psutil.Error) as exc:
        report["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    write_result("core", report)
    print_report(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    """One line per figure."""
    for key in ("relaunch", "release_attached", "release_detached"):
        if key in report:
            figures = {k: v for k, v in report[key].items() if isinstance(v, dict)}
            for name, s in figures.items():
                print(f"{key:18} {name:24} n={s['n']} median={s['median']} p90={s['p90']} max={s['max']}")
    fp = report.get("footprint")
    if fp:
        print(
            f"footprint          daemon RSS median {fp['rss_mib']['median']} MiB (max {fp['rss_mib']['max']}), "
            f"CPU {fp['cpu_percent']['mean']} % mean (max {fp['cpu_percent']['max']}) over {fp['window_s']} s"
        )
    if "error" in report:
        print(f"error: {report['error']}")


if __name__ == "__main__":
    main()
