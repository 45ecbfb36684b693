"""The alternatives an operator runs today, each a small faithful model of the tool's defaults (bench_baselines).

Each model drives one simulated server (`SimHost`) from a thread, as the real tool would: Kubernetes' liveness
probe and container restarts, systemd's `Restart=on-failure`, SGLang's own watchdog, a hand-written script.
`bench_baselines` documents the defaults each one follows.
"""

from __future__ import annotations

import abc
import contextlib
import signal
import threading
import time

import psutil

from benchmarks.common import SimHost, http_status, kill_marked

CLEAN_SIGNALS = {-signal.SIGHUP, -signal.SIGINT, -signal.SIGTERM, -signal.SIGPIPE}


class Baseline(abc.ABC):
    """A tool's loop in a thread; `actions` are (wall time, what it did); the first one is the detection."""

    name = "baseline"
    watchdog = False

    def __init__(self, host: SimHost) -> None:
        self.host = host
        self.actions: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._guarded, daemon=True)

    def act(self, what: str) -> None:
        """Record an action."""
        self.actions.append((time.time(), what))

    def _guarded(self) -> None:
        with contextlib.suppress(OSError, psutil.Error):
            self.loop()

    @abc.abstractmethod
    def loop(self) -> None:
        """The tool's behaviour until `stop` is set."""


class Kubernetes(Baseline):
    """Liveness probe on /health plus restartPolicy Always with CrashLoopBackOff."""

    name = "k8s"
    timeout_s = 25.0

    def __init__(self, host: SimHost) -> None:
        super().__init__(host)
        self.restarts = 0

    def _restart(self) -> None:
        delay = 0.0 if self.restarts == 0 else min(300.0, 10.0 * 2 ** (self.restarts - 1))
        self.restarts += 1
        if not self.stop.wait(delay):
            self.host.launch()

    def loop(self) -> None:
        fails = 0
        next_probe = time.monotonic()
        while not self.stop.is_set():
            code = self.host.proc.poll()
            if code is not None:
                self.act(f"container exited ({code}): restart")
                kill_marked(self.host.sim)
                self._restart()
                fails, next_probe = 0, time.monotonic()
                continue
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + 10.0
                ok = http_status(self.host.url + "/health", self.timeout_s) == 200
                fails = 0 if ok else fails + 1
                if fails >= 3:
                    self.act("liveness failed 3x: SIGTERM, 30 s grace, SIGKILL container, restart")
                    self.host.stop_main(30.0)
                    self._restart()
                    fails, next_probe = 0, time.monotonic()
            self.stop.wait(0.05)


class KubernetesDefault(Kubernetes):
    """The same with the default timeoutSeconds 1."""

    name = "k8s_default"
    timeout_s = 1.0


class Systemd(Baseline):
    """Restart=on-failure, KillMode=control-group, RestartSec=100ms, StartLimitBurst=5 in 10 s."""

    name = "systemd"

    def loop(self) -> None:
        starts = [time.monotonic()]
        while not self.stop.is_set():
            code = self.host.proc.poll()
            if code is None:
                self.stop.wait(0.05)
                continue
            clean = code == 0 or code in CLEAN_SIGNALS
            self.act(f"main exited ({code}): " + ("clean, no restart" if clean else "restart"))
            self.host.term_all(90.0)
            if clean or self.stop.wait(0.1):
                return
            starts = [t for t in starts if time.monotonic() - t < 10.0] + [time.monotonic()]
            if len(starts) > 5:
                self.act("start-limit-hit: unit failed")
                return
            self.host.launch()


class SGLangWatchdog(Baseline):
    """SGLang by itself: whatever it detects ends in its own exit; nothing relaunches it."""

    name = "sglang_watchdog"
    watchdog = True

    def loop(self) -> None:
        while not self.stop.is_set():
            code = self.host.proc.poll()
            if code is not None:
                self.act(f"server stopped itself ({code}); nothing relaunches it")
                return
            self.stop.wait(0.05)


class Script(Baseline):
    """Two /health failures ⇒ pkill -f sglang.launch_server, sleep 5, relaunch."""

    name = "script"

    def loop(self) -> None:
        fails = 0
        while not self.stop.wait(10.0):
            ok = http_status(self.host.url + "/health", 10.0) == 200
            fails = 0 if ok else fails + 1
            if fails >= 2:
                hit = self.host.pkill("launch_server")
                self.act(f"/health failed twice: pkill matched {hit}, relaunch")
                if self.stop.wait(5.0):
                    return
                self.host.launch()
                fails = 0


BASELINES: dict[str, type[Baseline]] = {
    t.name: t for t in (Kubernetes, KubernetesDefault, Systemd, SGLangWatchdog, Script)
}
