"""The built image run by a real engine on the simulator config, and what an operator sees of it.

A container runs with `--network none` unless a test asks for the host's: its own loopback then holds the status
port 9400 that the image's `HEALTHCHECK` asks and the simulator's 30000, so containers never meet each other's
ports or the host's. The tests reach that loopback as the engine's health check does, from inside the container's
network namespace (`nsenter --net` of its PID 1: traffic to the container's 127.0.0.1 only). Everything else goes
through the engine's CLI: `run`, `exec`, `logs`, `inspect`, `stop`, `kill`, `start`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.container.engines import Engine
from tests.container.image import TAG
from tests.support.wait import wait_for

CONFIG = "/etc/sglang-supervisor/config.toml"
TOKEN = "/etc/sglang-supervisor/token"
STATUS_PORT = 9400  # the image's HEALTHCHECK and EXPOSE
SIM_PORT = 30000
VENV = "/opt/sglang-supervisor/venv"
SIM = "/var/lib/sglang-sim"
ENTRYPOINT = [f"{VENV}/bin/sglang-supervisor", "run", "--config", CONFIG]  # examples/Dockerfile's, exec form
STOP_TIMEOUT_S = 180  # the documented stop timeout (README, runbook, examples)
FIGURES: dict[str, str] = {}  # measured figures of this run, printed in the tier's summary
_REQUEST = (
    "import sys, urllib.request, urllib.error\n"
    "data = sys.argv[3].encode() if len(sys.argv) > 3 else None\n"
    "req = urllib.request.Request(sys.argv[1], data=data, headers={'Content-Type': 'application/json'})\n"
    "try:\n"
    "    r = urllib.request.urlopen(req, timeout=float(sys.argv[2]))\n"
    "    code, body = r.status, r.read()\n"
    "except urllib.error.HTTPError as e:\n"
    "    code, body = e.code, e.read()\n"
    "except OSError:\n"
    "    code, body = 0, b''\n"
    "sys.stdout.write(str(code) + '\\n' + body.decode(errors='replace'))\n"
)


def config(
    *,
    drain_grace_s: int = 5,
    probes: dict[str, Any] | None = None,
    host: str = "0.0.0.0",
    port: int = STATUS_PORT,
    tp: int = 2,
    sim_port: int = SIM_PORT,
) -> str:
    """A simulator config for inside the image: state, logs and stand-in GPUs in the container's own folders, the
    simulator from the supervisor's venv (the image's python3 has only the stand-in SGLang), the control token
    mounted beside it."""
    gpus = list(range(tp))
    env = {
        "SGLANG_SIM_STATE_DIR": SIM,
        "SGLANG_SIM_SHM_DIR": "/dev/shm",
        "SGLANG_SIM_CONTROL": "1",
        "SGLANG_SIM_STARTUP_S": "0.3",
        "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
        "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
    }
    args = ["--model-path", "moonshotai/Kimi-K2.5", "--tp-size", str(tp), "--port", str(sim_port),
            "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2", "--enable-metrics"]  # fmt: skip
    lines = [
        "[supervisor]",
        'state_dir = "/var/lib/sglang-supervisor"',
        'log_dir = "/var/log/sglang-supervisor"',
        'shm_dir = "/dev/shm"',
        'gpu_backend = "sim"',
        f'sim_state_dir = "{SIM}"',
        "release_deadline_s = 15",
        "[supervisor.http]",
        f'host = "{host}"',
        f"port = {port}",
        f'token_file = "{TOKEN}"',
        "[supervisor.restart]",
        "initial_s = 0.2",
        "max_s = 2",
        "[[servers]]",
        'name = "sim"',
        f"command = {json.dumps([f'{VENV}/bin/python', '-m', 'simulator.launch_server'])}",
        f"args = {json.dumps(args)}",
        f"gpus = {gpus}",
        f"gpu_device_paths = {json.dumps([f'{SIM}/dev/nvidia{g}' for g in gpus])}",
        f"ports = [{sim_port + 2}]",
        "startup_budget_s = 120",
        "startup_silence_s = 60",
        f"drain_grace_s = {drain_grace_s}",
        "[servers.env]",
        *(f"{k} = {json.dumps(v)}" for k, v in env.items()),
        "[servers.probes]",
        *(f"{k} = {json.dumps(v)}" for k, v in (probes or {}).items()),
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Box:
    """One container of the image, named `name`, its config and token in the host folder `folder`."""

    engine: Engine
    name: str
    folder: Path

    @classmethod
    def run(
        cls, engine: Engine, folder: Path, name: str, options: Sequence[str] = (), text: str | None = None
    ) -> Box:
        """`run -d` the image with the config (and token) mounted read-only, as the README does."""
        cls.write(folder, text if text is not None else config())
        return cls.start(engine, folder, name, options)

    @staticmethod
    def write(folder: Path, text: str) -> None:
        """The config and the control token (mode 0600) in the host folder."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text(text)
        token = folder / "token"
        token.write_text("s3cret-token\n")
        token.chmod(0o600)

    @classmethod
    def start(
        cls, engine: Engine, folder: Path, name: str, options: Sequence[str] = (), image: str = TAG
    ) -> Box:
        """`run -d` the image with the folder's config and token mounted read-only."""
        network = [] if any(o.startswith("--network") for o in options) else ["--network", "none"]
        engine(
            "run", "-d", "--name", name, *network, *options,
            "-v", f"{folder / 'config.toml'}:{CONFIG}:ro", "-v", f"{folder / 'token'}:{TOKEN}:ro", image,
        )  # fmt: skip
        return cls(engine, name, folder)

    def __call__(
        self, *args: str, timeout_s: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The engine's CLI on this container: `box("stop")` is `docker stop NAME`."""
        return self.engine(args[0], *args[1:], self.name, timeout_s=timeout_s, check=check)

    def exec(
        self, *argv: str, check: bool = True, timeout_s: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return self.engine("exec", self.name, *argv, timeout_s=timeout_s, check=check)

    def state(self) -> dict[str, Any]:
        return self.engine.state(self.name)

    def running(self) -> bool:
        return bool(self.state()["Running"])

    # ---- the container's loopback, from inside its network namespace
    def get(self, path: str, port: int = STATUS_PORT, timeout_s: float = 4.0) -> tuple[int, str]:
        """GET `path` on the container's loopback: (status, body); (0, "") when nothing answers."""
        return self._request(path, port, timeout_s)

    def post(self, path: str, body: dict[str, Any], port: int, timeout_s: float) -> tuple[int, str]:
        """POST JSON `body` to `path` on the container's loopback: (status, body); (0, "") when nothing answers."""
        return self._request(path, port, timeout_s, json.dumps(body))

    def post_fault(self, fault: dict[str, Any]) -> tuple[int, str]:
        """Arm a simulator fault live (`POST /sim/fault` on the container's loopback)."""
        return self._request("/sim/fault", SIM_PORT, 10.0, json.dumps(fault))

    def _request(self, path: str, port: int, timeout_s: float, body: str | None = None) -> tuple[int, str]:
        pid = self.engine.host_pid(self.name)
        if not pid:
            return 0, ""
        argv = [sys.executable, "-c", _REQUEST, f"http://127.0.0.1:{port}{path}", str(timeout_s)]
        result = subprocess.run(
            ["nsenter", f"--net=/proc/{pid}/ns/net", *argv, *([body] if body is not None else [])],
            capture_output=True, text=True, timeout=timeout_s + 30, check=False,
        )  # fmt: skip
        code, _, answer = result.stdout.partition("\n")
        return (int(code), answer) if code.isdigit() else (0, "")

    def requests_running(self, port: int = SIM_PORT) -> bool:
        """Whether the server inside counts a request running (`sglang:num_running_reqs` above 0)."""
        _, metrics = self.get("/metrics", port=port)
        return any(
            line.startswith("sglang:num_running_reqs") and float(line.split()[-1]) > 0
            for line in metrics.splitlines()
        )

    def post_in_background(
        self, path: str, body: dict[str, Any], port: int = SIM_PORT
    ) -> subprocess.Popen[bytes]:
        """A POST from inside the container's network namespace that may never be answered (killed by its pid)."""
        pid = self.engine.host_pid(self.name)
        script = (
            "import sys, urllib.request\n"
            "r = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(),"
            " headers={'Content-Type': 'application/json'})\n"
            "urllib.request.urlopen(r, timeout=600).read()\n"
        )
        url = f"http://127.0.0.1:{port}{path}"
        argv = ["nsenter", f"--net=/proc/{pid}/ns/net", sys.executable, "-c", script, url, json.dumps(body)]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def status(self) -> dict[str, Any] | None:
        code, body = self.get("/status")
        if code != 200:
            return None
        with contextlib.suppress(ValueError):
            found = json.loads(body)
            return found if isinstance(found, dict) else None
        return None

    def server(self) -> dict[str, Any] | None:
        status = self.status()
        return dict(status["servers"][0]) if status else None

    def wait_server(
        self, check: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        """Poll /status until `check(server)` holds; fail with the container's log (at once if it has exited)."""

        def probe() -> dict[str, Any] | None:
            if not self.running():
                raise AssertionError(f"{self.name} exited while waiting for {what}:\n{self.logs()[-4000:]}")
            server = self.server()
            return server if server is not None and check(server) else None

        try:
            return wait_for(probe, timeout_s, what, interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()[-4000:]}") from None

    def wait_serving(self, timeout_s: float = 90.0) -> dict[str, Any]:
        return self.wait_server(lambda s: s["state"] == "serving", timeout_s, f"{self.name} serving")

    # ---- what the engine shows
    def logs(self) -> str:
        result = self.engine("logs", self.name, check=False)
        return result.stdout + result.stderr

    def events(self, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of `event` in the container's log (PID 1's and the daemon's alike)."""
        found = []
        for line in self.logs().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
        return found

    def processes(self) -> list[tuple[int, int, str]]:
        """(pid, ppid, command line) of every process in the container, as `ps` inside shows them."""
        rows = []
        for line in self.exec("ps", "-e", "-ww", "-o", "pid=,ppid=,args=").stdout.splitlines():
            pid, ppid, args = line.split(None, 2)
            rows.append((int(pid), int(ppid), args))
        return rows

    def pid_namespace(self) -> str:
        """The container's PID namespace (the link of its PID 1's `/proc/PID/ns/pid`)."""
        return os.readlink(f"/proc/{self.engine.host_pid(self.name)}/ns/pid")

    @staticmethod
    def alive_in(namespace: str) -> list[int]:
        """Host PIDs of every process still in the PID namespace `namespace`."""
        found = []
        for pid in psutil.pids():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                    found.append(pid)
        return found

    def stop(self, *args: str, timeout_s: float = 300.0) -> tuple[int, float]:
        """`stop [ARGS] NAME`; (the container's exit code, seconds the stop took)."""
        started = time.monotonic()
        self("stop", *args, timeout_s=timeout_s)
        took = time.monotonic() - started
        return int(self.state()["ExitCode"]), took

    def wait_exited(self, timeout_s: float, what: str) -> int:
        """The exit code once the container has ended."""
        wait_for(lambda: not self.running(), timeout_s, what, interval=0.2)
        return int(self.state()["ExitCode"])


def record(name: str, value: str) -> None:
    """A figure of this run, printed in the tier's summary."""
    FIGURES[name] = value
    print(f"{name}: {value}")
