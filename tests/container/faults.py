"""Faults of mixed kinds for a server whose daemon is a container's PID 1, and the checks after each recovery.

Each fault is injected from outside as an operator or the hardware would cause it: the SGLang main process
SIGKILLed (a crash: its ranks die by their parent-death signal and re-parent to the daemon on the way), one
rank SIGKILLed, ranks that outlive their main process holding the GPUs (the simulator's
`orphans_hold_gpu_and_ports`: a process leak the release has to clean up), a silent decode wedge and a TP
collective desync hang (`watchdog_disabled_silent_wedge`, `overlap_tp_desync_hang`), a CUDA OOM crash with its
SIGQUIT teardown. After each: serving again from a new main process, nothing of the old tree alive (one run),
and every process that ended reaped — no zombie left in the namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psutil

from tests.container.support import ContainerDeployment
from tests.support import procs
from tests.support.nspawn import nspid

Injector = Callable[[ContainerDeployment], None]


def host_pid(dep: ContainerDeployment, inner: int) -> int:
    """The host PID of the namespace's process `inner`."""
    for pid in dep.namespace_pids():
        if nspid(pid)[-1:] == [inner]:
            return pid
    raise AssertionError(f"no process {inner} in the namespace")


def titled(dep: ContainerDeployment, title: str) -> int:
    """The host PID of the live namespace process whose title starts with `title`."""
    for pid, state in dep.namespace_pids().items():
        with contextlib.suppress(psutil.Error):
            if state != psutil.STATUS_ZOMBIE and procs.title(psutil.Process(pid)).startswith(title):
                return pid
    raise AssertionError(f"no live {title} in the namespace")


def request(dep: ContainerDeployment, timeout_s: float = 20.0) -> None:
    """One chat request in the background (a fault armed "after N requests" fires on it; it may hang)."""
    body = json.dumps(
        {"model": dep.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    ).encode()

    def send() -> None:
        req = urllib.request.Request(
            dep.sim_url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            urllib.request.urlopen(req, timeout=timeout_s).read()

    threading.Thread(target=send, daemon=True).start()


def arm(dep: ContainerDeployment, fault: dict[str, Any]) -> None:
    """Arm a simulator fault live (`POST /sim/fault`)."""
    status, body = dep.post("/sim/fault", fault, base=dep.sim_url)
    assert status == 200, (status, body)


def crash(dep: ContainerDeployment) -> None:
    os.kill(host_pid(dep, int(dep.server()["pid"])), signal.SIGKILL)


def rank_kill(dep: ContainerDeployment) -> None:
    os.kill(titled(dep, "sglang::scheduler_TP1"), signal.SIGKILL)


def orphaned_ranks(dep: ContainerDeployment) -> None:
    """From the next launch on, ranks outlive their main process; then the main is killed."""
    arm(dep, {"name": "orphans_hold_gpu_and_ports", "recur": True})
    crash(dep)


def silent_wedge(dep: ContainerDeployment) -> None:
    arm(dep, {"name": "watchdog_disabled_silent_wedge", "after_requests": 1})
    request(dep)


def desync_hang(dep: ContainerDeployment) -> None:
    arm(dep, {"name": "overlap_tp_desync_hang", "after_requests": 1})
    request(dep)


def oom(dep: ContainerDeployment) -> None:
    arm(dep, {"name": "runtime_cuda_oom_crash", "after_requests": 1})
    request(dep)


# Ten faults of mixed kinds, and the incidents each may be diagnosed as.
TEN: list[tuple[str, Injector, set[str]]] = [
    ("crash", crash, {"crash"}),
    ("rank kill", rank_kill, {"crash"}),
    ("orphaned ranks", orphaned_ranks, {"crash"}),
    ("TP desync hang", desync_hang, {"collective_hang", "decode_wedge"}),
    ("crash of a tree with orphans", crash, {"crash"}),
    ("CUDA OOM", oom, {"oom", "crash"}),
    ("rank kill with orphans", rank_kill, {"crash"}),
    ("silent decode wedge", silent_wedge, {"decode_wedge", "collective_hang", "health_unresponsive"}),
    ("crash", crash, {"crash"}),
    ("rank kill", rank_kill, {"crash"}),
]


def drive(dep: ContainerDeployment, faults: list[tuple[str, Injector, set[str]]]) -> list[str]:
    """Inject each fault once the server serves; after each recovery, one run alive and no zombie. The
    incidents' kinds, in order."""
    kinds = []
    current = dep.wait(lambda s: s.get("state") == "serving", 90, "serving")
    for n, (name, inject, expected) in enumerate(faults, 1):
        inject(dep)
        current = dep.wait(
            lambda s, pid=current["pid"]: s.get("state") == "serving" and s.get("pid") != pid,
            120,
            f"serving again after fault {n} ({name})",
        )
        incident = current["last_incident"]
        assert incident["fault"] in expected, (name, incident)
        kinds.append(incident["fault"])
        dep.no_zombies()
        assert len(dep.runs()) == 1, (name, dep.runs())
    return kinds
