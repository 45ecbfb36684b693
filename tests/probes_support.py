"""Launch the bundled simulator for probe tests, and adapt it to what a Monitor reads.

Each launch gets its own state dir and a free port, runs in its own session, logs to a file under tmp_path, and
is killed with its whole process group at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port that was free a moment ago (bind to port 0 on 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy, or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass(frozen=True)
class SimTree:
    """The TreeView of a simulator launch."""

    main_alive: bool
    missing_ranks: list[str]
    zombie_ranks: list[str]
    rank_cpu_s: dict[str, float]


@dataclass
class Sim:
    """A running simulator and the readers a Monitor needs."""

    proc: subprocess.Popen[bytes]
    port: int
    state_dir: Path
    log_path: Path
    tp: int
    _offset: int = 0
    _partial: str = ""
    seen: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return f"http://127.0.0.1:{self.port}"

    def log_lines(self) -> list[str]:
        """New complete log lines since the last call."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(4 * 1024 * 1024)
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        self.seen += lines
        return lines

    def _ranks(self) -> dict[str, psutil.Process]:
        found: dict[str, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    title = " ".join(child.cmdline())
                    if title.startswith("sglang::scheduler"):
                        found[title.split()[0]] = child
        return found

    def tree(self) -> SimTree:
        """Expected ranks alive / missing / zombie, with their CPU seconds."""
        ranks = self._ranks()
        expected = (
            [f"sglang::scheduler_TP{i}" for i in range(self.tp)] if self.tp > 1 else ["sglang::scheduler"]
        )
        cpu: dict[str, float] = {}
        zombie: list[str] = []
        for title, proc in ranks.items():
            with contextlib.suppress(psutil.Error):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    zombie.append(title)
                    continue
                times = proc.cpu_times()
                cpu[title] = times.user + times.system
        alive = self.proc.poll() is None
        missing = [t for t in expected if t not in ranks]
        return SimTree(alive, missing, zombie, cpu)

    def pids(self) -> dict[int, str]:
        """pid -> title of every scheduler rank."""
        return {p.pid: title for title, p in self._ranks().items()}

    def gpus(self) -> list[dict[str, Any]]:
        """The simulator's nvml.json GPUs."""
        path = self.state_dir / "nvml.json"
        if not path.exists():
            return []
        return list(json.loads(path.read_text()).get("gpus", []))

    def state(self) -> dict[str, Any]:
        """GET /sim/state (needs SGLANG_SIM_CONTROL=1)."""
        with urllib.request.urlopen(f"{self.base_url}/sim/state", timeout=10) as resp:
            return dict(json.loads(resp.read(1024 * 1024)))

    def stop(self) -> None:
        """SIGKILL the whole process group and reap the main process."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(self.proc.pid):
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


@contextlib.contextmanager
def launch_sim(
    tmp_path: Path,
    model: str,
    *extra: str,
    tp: int = 2,
    scenario: str = "",
    env: dict[str, str] | None = None,
) -> Iterator[Sim]:
    """Start `python -m simulator.launch_server` and always kill its process group afterwards."""
    port = free_port()
    state_dir = tmp_path / f"sim-{port}"
    state_dir.mkdir(parents=True)
    log_path = tmp_path / f"sim-{port}.log"
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SGLSUP_"))}
    child_env.update(
        {
            "SGLANG_SIM_STATE_DIR": str(state_dir),
            "SGLANG_SIM_STARTUP_S": "0.3",
            "SGLANG_SIM_CONTROL": "1",
            "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
            "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if scenario:
        child_env["SGLANG_SIM_SCENARIO"] = scenario
    child_env.update(env or {})
    argv = [
        sys.executable,
        "-m",
        "simulator.launch_server",
        "--model-path",
        model,
        "--tp-size",
        str(tp),
        "--port",
        str(port),
        "--enable-metrics",
        *extra,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    sim = Sim(proc, port, state_dir, log_path, tp)
    try:
        yield sim
    finally:
        sim.stop()
