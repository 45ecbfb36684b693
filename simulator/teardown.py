"""How the main process ends the way SGLang's does: SIGTERM drain, SIGQUIT crash teardown (leaving the /dev/shm
segments of an armed crash loop behind), the subprocess watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING

import psutil

from simulator.logs import log
from simulator.procs import kill_tree, leak_shm

if TYPE_CHECKING:
    from simulator.launch import Launch


def _is_scheduler(proc: psutil.Process) -> bool:
    try:
        return " ".join(proc.cmdline()).startswith("sglang::scheduler")
    except psutil.Error:
        return False


class Crash:
    """SIGTERM drain, SIGQUIT teardown and the subprocess watchdog of the main process."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.tearing_down = False

    def fatal(self, how: str) -> None:
        """A main-process component failed: "sigquit" tears down like a child failure, "exit" dies at once."""
        if how == "exit":
            self._leak_if_armed()
            kill_tree(include_parent=False, exit_code=1)
        os.kill(os.getpid(), signal.SIGQUIT)

    def _leak_if_armed(self) -> None:
        if self.launch.faults.get("dev_shm_crashloop") is not None:
            leak_shm()

    def sigterm(self) -> None:
        """Drain (no deadline: wedged requests keep it draining forever), then exit."""
        if self.launch.state.gracefully_exit:
            return
        log(f"SIGTERM received. signum={signal.SIGTERM} frame=None. Draining requests and shutting down...")
        self.launch.state.gracefully_exit = True
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        engine = self.launch.engine
        while True:
            if self.launch.state.status == "UnHealthy":
                log("Signal SIGTERM received while health check failed. Force exiting.")
                self._crash_dump()
                break
            remaining = engine.load if engine else 0
            if remaining == 0:
                break
            log(
                f"Gracefully exiting... Remaining number of requests {remaining}. Remaining requests remaining_rids=[...]."
            )
            await asyncio.sleep(5)
        for conn in [*self.launch.conns, self.launch.detok_conn]:
            with contextlib.suppress(OSError, ValueError):
                conn.send({"op": "shutdown"})
        if engine:
            engine.stop()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(p.is_alive() for _, p in self.launch.children):
            await asyncio.sleep(0.1)
        self.launch.marker.unlink(missing_ok=True)
        self.launch.publish_stopped()
        kill_tree(include_parent=True)

    def sigquit(self) -> None:
        """Running-phase SIGQUIT: crash diagnostics (blocking the event loop, as SGLang does), then kill the tree."""
        if self.tearing_down:
            return
        self.tearing_down = True
        log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        self._crash_dump()
        self._leak_if_armed()
        self.launch.publish_stopped()
        kill_tree(include_parent=True)

    def _crash_dump(self) -> None:
        def enabled(name: str) -> bool:
            return os.environ.get(name, "true").strip().lower() not in ("0", "false", "no", "off")

        pyspy, coredump = (
            enabled("SGLANG_PYSPY_DUMP_BEFORE_CRASH"),
            enabled("SGLANG_CUDA_COREDUMP_BEFORE_CRASH"),
        )
        if not (pyspy or coredump):
            return
        log("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        time.sleep(5)
        live = [p for p in psutil.Process().children(recursive=True) if _is_scheduler(p)]
        if not live:
            log("No live scheduler processes found; skipping py-spy and CUDA coredump.")
            return
        for proc in live if pyspy else []:
            log(f"Pyspy dump for PID {proc.pid}")
        if coredump:
            wait = float(os.environ.get("SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS", "60"))
            log(f"Waiting {wait} seconds for CUDA coredumps before exiting.")
            time.sleep(wait)

    async def subprocess_watchdog(self) -> None:
        """SGLang's SubprocessWatchdog: a child's non-zero exit → SIGQUIT to ourselves (blind after a C++ abort)."""
        while True:
            await asyncio.sleep(1)
            if self.launch.faults.fired("zombie_after_cpp_abort"):
                continue
            for name, proc in self.launch.children:
                if proc.exitcode not in (None, 0):
                    log(
                        f"Subprocess {name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. Triggering SIGQUIT for cleanup..."
                    )
                    os.kill(os.getpid(), signal.SIGQUIT)
                    return
