"""The installed wheel as PID 1 of a PID namespace of its own, supervising the simulator, watched from the host.

`unshare --pid --fork --mount-proc` gives the daemon PID 1 of a new PID namespace, as an engine gives an entrypoint
without `--init`, and nothing else: the config, state, logs and the simulator's stand-in GPUs have the same paths
inside and out, and the host's watch of the invariants (tests/support/treewatch.py) reads them as for any
deployment. The real engines run the built image (tests/container/running.py); this keeps the host's view of every
process through faults the engines' tests do not repeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import psutil

from tests.support import procs
from tests.support.daemon import Deployment
from tests.support.nspawn import nspid
from tests.support.treewatch import TreeWatch, stop_and_check
from tests.support.wait import wait_for
from tests.support.wheel import Installed

DRAINED_TIMEOUT_S = 180.0  # the documented stop timeout (docker stop -t, terminationGracePeriodSeconds)


@dataclass
class ContainerDeployment(Deployment):
    """A simulated server under the installed daemon, which is PID 1 of its own PID namespace."""

    installed: Installed | None = None

    def write(self) -> None:
        super().write()
        assert self.installed is not None
        python = json.dumps([str(self.installed.python), "-m", "simulator.launch_server"])
        text = self.config_path.read_text()
        text = re.sub(r"^command = .*$", f"command = {python}", text, count=1, flags=re.MULTILINE)
        self.config_path.write_text(text)

    def start(self) -> subprocess.Popen[bytes]:
        assert self.installed is not None
        if self.watch is None:
            self.watch = TreeWatch(self.server_names(), self.root / "state", self.device_map())
        argv = ["unshare", "--pid", "--fork", "--mount-proc"]
        argv += [str(self.installed.bin / "sglang-supervisor"), "run", "--config", str(self.config_path)]
        log = open(self.root / "daemon.log", "ab")  # noqa: SIM115 - the child owns it
        self.daemon = subprocess.Popen(
            argv, env=self.installed.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        wait_for(self.pid1, 30, "PID 1 of the namespace")
        return self.daemon

    def pid1(self) -> int | None:
        """The host PID of the namespace's PID 1 (our init)."""
        if self.daemon is None:
            return None
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.daemon.pid).children():
                if nspid(child.pid)[-1:] == [1]:
                    return child.pid
        return None

    def namespace_pids(self) -> dict[int, str]:
        """Every process of the namespace: host PID → its state letter."""
        leader = self.pid1()
        if leader is None:
            return {}
        with contextlib.suppress(OSError):
            ns = os.readlink(f"/proc/{leader}/ns/pid")
            found = {}
            for pid in psutil.pids():
                with contextlib.suppress(OSError, psutil.Error):
                    if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                        found[pid] = psutil.Process(pid).status()
            return found
        return {}

    def zombies(self) -> list[int]:
        return [pid for pid, state in self.namespace_pids().items() if state == psutil.STATUS_ZOMBIE]

    def no_zombies(self, timeout_s: float = 10.0) -> None:
        """Every process of the namespace that ended has been reaped (a zombie waits at most its grace)."""
        try:
            wait_for(lambda: not self.zombies(), timeout_s, "no zombie in the namespace", interval=0.1)
        except AssertionError:
            names = [procs.title(psutil.Process(p)) or str(p) for p in self.zombies()]
            raise AssertionError(f"zombies left in the namespace: {names}") from None

    def runs(self) -> set[str]:
        """The runs of the server alive now, as the host's watch sees them."""
        assert self.watch is not None
        return {seen.run for seen in self.watch.now()}

    def docker_stop(self, timeout_s: float) -> tuple[int | None, float]:
        """`docker stop -t timeout_s`: SIGTERM to PID 1, SIGKILL after the timeout; (exit status, seconds)."""
        assert self.daemon is not None
        started = time.monotonic()
        leader = self.pid1()
        assert leader is not None
        os.kill(leader, signal.SIGTERM)
        try:
            code: int | None = self.daemon.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader, signal.SIGKILL)
            code = self.daemon.wait(timeout=30)
        return code, time.monotonic() - started

    def log_events(self, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of `event` (from PID 1 and the daemon alike)."""
        found = []
        for line in (self.root / "daemon.log").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
        return found

    def stop_checked(self) -> list[str]:
        """Stop the namespace as a container runtime does (SIGTERM to PID 1, the documented timeout), then check
        the invariants: one tree at a time; nothing left after a clean stop."""
        assert self.watch is not None
        if self.daemon is not None and self.daemon.poll() is None and self.pid1() is not None:
            self.docker_stop(DRAINED_TIMEOUT_S)
        return stop_and_check(self.daemon, self.watch)
