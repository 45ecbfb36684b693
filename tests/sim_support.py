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
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
FAST_CRASH = {
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS": "0",
}


def free_port(span: int = 4) -> int:
    """A port p such that p .. p+span-1 are free now (the simulator binds rpc ports at p+2 and up)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + span < 65535 and all(_bindable(p) for p in range(port, port + span)):
            return port
    raise RuntimeError("no free port range found")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Response:
    """An HTTP answer: status (0 when the connection was refused), headers and body."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


def http(
    url: str,
    method: str = "GET",
    body: bytes | dict[str, Any] | None = None,
    timeout: float = 10.0,
    content_type: str = "application/json",
) -> Response:
    """One HTTP request; a refused connection is status 0, an HTTP error keeps its status and body."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(1 << 24), dict(resp.headers))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read(1 << 24), dict(exc.headers))
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return Response(0, b"")
        if isinstance(exc.reason, TimeoutError):
            raise exc.reason from exc
        raise


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
            procs = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return {}
        return {t: p for p in procs if (t := title(p)).startswith("sglang::")}

    def titles(self) -> list[str]:
        """Process titles (cmdlines) of the live `sglang::` processes carrying this run's state dir."""
        return sorted(t for p in ours(self.state_dir) if (t := title(p)).startswith("sglang::"))

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

    def exited(self, timeout: float = 20.0) -> int:
        """Wait for the main process to exit; its return code."""
        return self.proc.wait(timeout=timeout)


def title(proc: psutil.Process) -> str:
    """The process title as `ps` shows it (setproctitle pads the cmdline)."""
    try:
        return " ".join(proc.cmdline()).strip()
    except psutil.Error:
        return ""


def ours(state_dir: Path) -> list[psutil.Process]:
    """Every live process of this run: its environment names the state dir, or it holds a stand-in GPU open.

    setproctitle overwrites the environment block of titled processes (as in SGLang), so the ranks are found
    by the device files they hold.
    """
    pids = {pid for dev in sorted((state_dir / "dev").glob("nvidia*")) for pid in holders(dev)}
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            mine = proc.pid in pids or proc.environ().get("SGLANG_SIM_STATE_DIR") == str(state_dir)
            if mine and proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def holders(path: Path) -> list[int]:
    """PIDs holding `path` open, found by scanning /proc/*/fd as `fuser` does."""
    pids = []
    target = str(path)
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
    return sorted(pids)


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
    port = port or free_port()
    full_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SGL_", "CUDA_VISIBLE_DEVICES"))
    }
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
    """Poll until the ready line is logged and `/health` answers 200."""
    sim.wait_log("The server is fired up and ready to roll!", timeout)
    wait_for(lambda: sim.get("/health").status == 200, timeout, "/health 200")


def kill_group(sim: Sim) -> None:
    """SIGKILL one server's process group (others sharing its state dir live on); wait until it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sim.pid, signal.SIGKILL)
    sim.proc.wait(timeout=10)

    def gone() -> bool:
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(proc.pid) == sim.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    return False
        return True

    wait_for(gone, 10, "the process group gone")


def cleanup(sim: Sim) -> None:
    """SIGKILL the process group and every process carrying the state dir; wait until none is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sim.pid, signal.SIGKILL)
    for proc in ours(sim.state_dir):
        with contextlib.suppress(psutil.Error):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        sim.proc.wait(timeout=10)
    wait_for(lambda: not ours(sim.state_dir), 10, "every simulator process gone")


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
