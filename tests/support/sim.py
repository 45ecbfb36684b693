"""Launch the simulator like an operator would, observe it from outside, and clean up everything it leaves.

`launched_sim(tmp_path, *sglang_args, env=...)` starts `python -m simulator.launch_server` in its own session
with a private state dir and free ports, polls until `/health` answers 200 (or not, with `ready=False`), yields
a `Sim`, and at the end SIGKILLs its process group and every process whose environment names its state dir
or that holds one of its stand-in GPUs (orphans in their own session included).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.support import procs
from tests.support.http import Response, http
from tests.support.ports import free_port
from tests.support.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
FAST_CRASH = {
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS": "0",
}
_INHERITED_NOT = ("SGLANG_", "SGL_", "SGLSUP_", "CUDA_VISIBLE_DEVICES")


@dataclass
class Sim:
    """A running simulator as an operator sees it."""

    proc: subprocess.Popen[bytes]
    port: int
    state_dir: Path
    log_path: Path
    env: dict[str, str]

    @property
    def pid(self) -> int:
        """The main process."""
        return self.proc.pid

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 30.0) -> Response:
        """GET a path of the server."""
        return http(self.base_url + path, timeout=timeout)

    def post(self, path: str, body: dict[str, Any], timeout: float = 30.0) -> Response:
        """POST JSON to a path of the server."""
        return http(self.base_url + path, "POST", body, timeout=timeout)

    def log(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """Wait until a log line matches the regex."""
        return wait_for(lambda: re.search(pattern, self.log()), timeout, f"log line {pattern!r}")

    def tree(self) -> dict[str, psutil.Process]:
        """The main process's live `sglang::` descendants by title."""
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        return {t: p for p in children if (t := procs.title(p)).startswith("sglang::")}

    def titles(self) -> list[str]:
        """Process titles (cmdlines) of the live `sglang::` processes carrying this run's state dir."""
        return sorted(t for p in procs.ours(self.state_dir) if (t := procs.title(p)).startswith("sglang::"))

    def metrics(self) -> dict[str, float]:
        """`/metrics` as {series: value}."""
        text = self.get("/metrics").body.decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }

    def nvml(self) -> dict[str, Any]:
        """The stand-in NVML state file."""
        data: dict[str, Any] = json.loads((self.state_dir / "nvml.json").read_text())
        return data

    def state(self) -> dict[str, Any]:
        """The simulator's own view, GET /sim/state (needs SGLANG_SIM_CONTROL=1)."""
        data: dict[str, Any] = self.get("/sim/state").json()
        return data

    def exited(self, timeout: float = 20.0) -> int:
        """Wait for the main process to exit; its return code."""
        return self.proc.wait(timeout=timeout)


def start(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    name: str = "sim",
    state_dir: Path | None = None,
    module: str = "simulator.launch_server",
) -> Sim:
    """Start a simulator process (no waiting); `args` are SGLang launch flags."""
    state = state_dir or tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    port = port or free_port(4)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_NOT)}
    full_env.update(
        {"SGLANG_SIM_STATE_DIR": str(state), "SGLANG_SIM_STARTUP_S": "0.3", "PYTHONUNBUFFERED": "1"}
    )
    full_env.update(env or {})
    log_path = tmp_path / f"{name}-{port}.log"
    argv = [sys.executable, "-m", module, *args]
    if module == "simulator.launch_server":
        argv += ["--port", str(port)]
        if not any(a.startswith("--model") for a in args):
            argv += ["--model-path", "Qwen/Qwen3-8B"]
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Sim(proc, port, state, log_path, full_env)


def wait_ready(sim: Sim, timeout: float = 90.0) -> None:
    """Poll until the ready line is logged and `/health` answers 200; fail at once, with its log, if it exits."""

    def ready() -> str | None:
        if "The server is fired up and ready to roll!" in sim.log():
            return "ready"
        return None if sim.proc.poll() is None else "exited"

    try:
        outcome = wait_for(ready, timeout, "the ready line")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {sim.log_path.name} ends:\n{sim.log()[-3000:]}") from None
    if outcome == "exited":
        raise AssertionError(
            f"{sim.log_path.name} exited ({sim.proc.returncode}) before ready:\n{sim.log()[-3000:]}"
        )
    wait_for(lambda: sim.get("/health").status == 200, timeout, "/health 200")


def kill_group(sim: Sim) -> None:
    """SIGKILL one server's process group (others sharing its state dir live on); wait until it is gone."""
    procs.kill_group(sim.pid)
    sim.proc.wait(timeout=10)


def cleanup(sim: Sim) -> None:
    """SIGKILL the process group and every process carrying the state dir; wait until none is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sim.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        sim.proc.wait(timeout=10)
    procs.kill_all(sim.state_dir)


@contextlib.contextmanager
def launched_sim(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    ready: bool = True,
    port: int | None = None,
    name: str = "sim",
    state_dir: Path | None = None,
) -> Iterator[Sim]:
    """A simulator for the `with` block (waited ready unless `ready=False`), torn down completely after."""
    sim = start(tmp_path, *args, env=env, port=port, name=name, state_dir=state_dir)
    try:
        if ready:
            wait_ready(sim)
        yield sim
    finally:
        cleanup(sim)


def scenario_file(tmp_path: Path, text: str) -> str:
    """Write a scenario TOML file and return its path for SGLANG_SIM_SCENARIO."""
    path = tmp_path / f"scenario-{abs(hash(text))}.toml"
    path.write_text(text)
    return str(path)


def pyspy_dump(pid: int) -> str:
    """The real `py-spy dump --pid` of a process (py-spy sits next to the test interpreter)."""
    pyspy = Path(sys.executable).with_name("py-spy")
    result = subprocess.run(
        [str(pyspy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
    )
    return result.stdout + result.stderr
