"""Run the daemon as an operator would (a subprocess with a config) against the simulator, and clean up."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support import procs
from tests.support.ports import free_port
from tests.support.treewatch import VIOLATIONS, TreeWatch, stop_and_check
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]


def toml_value(value: Any) -> str:
    """A TOML value (inline tables for dicts; JSON is TOML for the rest used here)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{q(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def q(text: str) -> str:
    """A TOML string."""
    return json.dumps(text)


@dataclass
class Deployment:
    """A config on disk for one simulated server and the daemon process running it."""

    root: Path
    name: str = "sim"
    model: str = "moonshotai/Kimi-K2.5"
    tp: int = 2
    # GPUs on this host: the whole TP group (0) unless the group spans nodes.
    local_gpus: int = 0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restart: dict[str, float] = field(default_factory=dict)
    probes: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    alertmanager_url: str = ""
    parsers: tuple[str | None, str | None] = ("kimi_k2", "kimi_k2")
    token: str = "s3cret-token"
    sim_ports: int = (
        3  # consecutive ports the simulator takes from --port (one more per DP rank past the first)
    )
    daemon: subprocess.Popen[bytes] | None = None
    watch: TreeWatch | None = None  # the invariants, watched from the first start to the cleanup

    def __post_init__(self) -> None:
        self.sim = self.root / "sim"
        self.port = free_port(self.sim_ports)
        self.http_port = free_port()
        self.config_path = self.root / "config.toml"
        self.write()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def sim_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def devices(self) -> list[Path]:
        return [self.sim / "dev" / f"nvidia{g}" for g in range(self.local_gpus or self.tp)]

    def write(self) -> None:
        args = [
            "--model-path",
            self.model,
            "--tp-size",
            str(self.tp),
            "--enable-metrics",
            "--port",
            str(self.port),
        ]
        if self.parsers[0]:
            args += ["--tool-call-parser", self.parsers[0]]
        if self.parsers[1]:
            args += ["--reasoning-parser", self.parsers[1]]
        args += self.extra_args
        env = self.sim_env()
        lines = [
            *self.supervisor_lines(),
            "[[servers]]",
            f"name = {q(self.name)}",
            f"command = {json.dumps([sys.executable, '-m', 'simulator.launch_server'])}",
            f"args = {json.dumps(args)}",
            f"gpus = {list(range(self.local_gpus or self.tp))}",
            f"gpu_device_paths = {json.dumps([str(d) for d in self.devices])}",
            f"ports = [{self.port + 2}]",
            "startup_budget_s = 120",
            "startup_silence_s = 60",
            "drain_grace_s = 10",
            "[servers.env]",
            *(f"{k} = {q(v)}" for k, v in env.items()),
            "[servers.probes]",
            *(f"{k} = {json.dumps(v)}" for k, v in self.probes.items()),
            "[servers.policy]",
            *(f"{k} = {toml_value(v)}" for k, v in self.policy.items()),
            *(
                ["[alerts.alertmanager]", f"url = {q(self.alertmanager_url)}"]
                if self.alertmanager_url
                else []
            ),
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def sim_env(self) -> dict[str, str]:
        """The simulator's environment: private state dir, fast start, fast crash teardown."""
        return {
            "SGLANG_SIM_STATE_DIR": str(self.sim),
            "SGLANG_SIM_SHM_DIR": str(self.sim / "shm"),
            "SGLANG_SIM_CONTROL": "1",
            "SGLANG_SIM_STARTUP_S": "0.3",
            "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
            "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
            **self.env,
        }

    def supervisor_lines(self) -> list[str]:
        """The `[supervisor]` tables of the config (and the control token file)."""
        restart = {"initial_s": 0.2, "max_s": 2.0, **self.restart}
        (self.root / "token").write_text(self.token + "\n")
        return [
            "[supervisor]",
            f"state_dir = {q(str(self.root / 'state'))}",
            f"log_dir = {q(str(self.root / 'log'))}",
            f"shm_dir = {q(str(self.sim / 'shm'))}",
            'gpu_backend = "sim"',
            f"sim_state_dir = {q(str(self.sim))}",
            "release_deadline_s = 15",
            "[supervisor.http]",
            'host = "127.0.0.1"',
            f"port = {self.http_port}",
            f"token_file = {q(str(self.root / 'token'))}",
            "[supervisor.restart]",
            *(f"{k} = {v}" for k, v in restart.items()),
        ]

    def start(self) -> subprocess.Popen[bytes]:
        """Start `sglang-supervisor run --config` in its own session, logs to a file."""
        if self.watch is None:
            self.watch = TreeWatch(self.server_names(), self.root / "state", self.device_map())
        log = open(self.root / "daemon.log", "ab")  # noqa: SIM115 - the child owns it
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "run", "--config", str(self.config_path)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self.daemon

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/status", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def server(self) -> dict[str, Any]:
        return dict(self.status()["servers"][0])

    def servers(self) -> dict[str, dict[str, Any]]:
        """Each server's /status entry by name ({} while the daemon does not answer)."""
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError, KeyError):
            return {s["name"]: s for s in self.status()["servers"]}
        return {}

    def wait_all(
        self, pred: Callable[[dict[str, dict[str, Any]]], bool], timeout: float = 90.0, what: str = ""
    ) -> dict[str, dict[str, Any]]:
        """Poll /status until `pred({name: server})` holds; fail (at once if the daemon exits) with its log."""
        last: dict[str, dict[str, Any]] = {}

        def check() -> dict[str, dict[str, Any]] | None:
            nonlocal last
            last = self.servers() or last
            with contextlib.suppress(IndexError, KeyError, StopIteration):
                if last and pred(last):
                    return last
            if self.daemon is not None and self.daemon.poll() is not None:
                raise AssertionError(f"the daemon exited while waiting for {what}")
            return None

        try:
            return wait_for(check, timeout, what, interval=0.1)
        except AssertionError as exc:
            states = json.dumps(last)[:3000]
            raise AssertionError(f"{exc}: {states}\n{self.log_tail()}") from None

    def wait(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float = 60.0, what: str = ""
    ) -> dict[str, Any]:
        """Poll /status until `pred(the first server)` holds; return that server's entry."""
        found = self.wait_all(lambda servers: pred(next(iter(servers.values()))), timeout, what)
        return next(iter(found.values()))

    def log_tail(self, n: int = 60) -> str:
        path = self.root / "daemon.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def sim_state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.sim_url + "/sim/state", timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def post(
        self, path: str, body: dict[str, Any], token: str | None = None, base: str | None = None
    ) -> tuple[int, Any]:
        req = urllib.request.Request(
            (base or self.url) + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def ours(self) -> list[psutil.Process]:
        """Every live process of this deployment (any run): its simulator state dir is the test's own."""
        return procs.ours(self.sim)

    def server_names(self) -> list[str]:
        """The servers of the config."""
        return [self.name]

    def device_map(self) -> dict[str, list[Path]]:
        """Each server's GPU device files."""
        return {self.name: self.devices}

    def stop_checked(self) -> list[str]:
        """Stop the daemon as systemd does (SIGTERM) and say what broke the invariants (tests/support/treewatch.py)."""
        assert self.watch is not None
        return stop_and_check(self.daemon, self.watch)

    def cleanup(self, record: bool = True) -> list[str]:
        """Stop the daemon gracefully, check the invariants (one tree at a time, nothing left after the stop),
        then kill anything of ours still alive. What broke is returned, and with `record` also kept for the
        per-test check (tests/conftest.py)."""
        problems = self.stop_checked() if self.watch is not None else []
        self.watch = None
        if record:
            VIOLATIONS.extend(problems)
        if self.daemon is not None and self.daemon.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.daemon.pid, signal.SIGKILL)
            self.daemon.wait(timeout=10)
        procs.kill_all(self.sim)
        return problems


@contextlib.contextmanager
def deployment(root: Path, **kw: Any) -> Iterator[Deployment]:
    """A deployment that is always cleaned up; its invariants fail the test after a body that passed."""
    dep = Deployment(root, **kw)
    with checked(dep):
        yield dep


@contextlib.contextmanager
def checked(dep: Deployment) -> Iterator[None]:
    """Clean `dep` up after the body; raise what broke the invariants unless the body failed already."""
    try:
        yield
    except BaseException:
        dep.cleanup(record=False)
        raise
    problems = dep.cleanup(record=False)
    if problems:
        raise AssertionError("\n".join(problems))


class Traffic:
    """Background chat requests to the simulator (bounded: one at a time, short timeouts, stops on exit)."""

    def __init__(self, base_url: str, model: str, period_s: float = 0.3, max_requests: int = 2000) -> None:
        self.base_url, self.model, self.period_s, self.max_requests = base_url, model, period_s, max_requests
        self.stop = threading.Event()
        self.sent = 0
        self.failed = 0  # requests that got no 200 answer (refused, timed out, an error status)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
        ).encode()
        while not self.stop.is_set() and self.sent < self.max_requests:
            self.sent += 1
            req = urllib.request.Request(
                self.base_url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(req, timeout=3).read()
            except (OSError, urllib.error.URLError, ValueError):
                self.failed += 1
            self.stop.wait(self.period_s)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@dataclass
class PdDeployment(Deployment):
    """A prefill (GPU 0), a decode (GPU 1) and a PD router on one simulated host (or, with `gateway_lines`, a
    `[gateway]` in the router's place: SGLang's gateway in PD mode, not supervised)."""

    prefill_env: dict[str, str] = field(default_factory=dict)
    decode_env: dict[str, str] = field(default_factory=dict)
    gateway_lines: list[str] = field(default_factory=list)
    router_bootstrap: str = ""  # the bootstrap port the router names for the prefill ('' = the prefill's own)

    def write(self) -> None:
        self.tp = 1
        self.boot = free_port()
        self.decode_port = free_port(3)
        self.router_port = free_port()
        env = {**self.sim_env(), "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120"}
        sim = [sys.executable, "-m", "simulator.launch_server"]
        common = ["--model-path", self.model, "--enable-metrics", "--tool-call-parser", "kimi_k2"]
        common += ["--reasoning-parser", "kimi_k2"]
        servers = [
            ("prefill", "prefill", sim, [*common, "--disaggregation-mode", "prefill", "--port", str(self.port),
             "--disaggregation-bootstrap-port", str(self.boot)], [0], {**env, **self.prefill_env},
             [self.port + 2]),
            ("decode", "decode", sim, [*common, "--disaggregation-mode", "decode", "--port", str(self.decode_port),
             "--disaggregation-bootstrap-port", str(self.boot)], [1], {**env, **self.decode_env},
             [self.decode_port + 2]),
            ("router", "router", [sys.executable, "-m", "simulator.launch_router"],
             ["--pd-disaggregation", "--prefill", f"http://127.0.0.1:{self.port}", self.router_bootstrap or str(self.boot),
              "--decode",
              f"http://127.0.0.1:{self.decode_port}", "--host", "127.0.0.1", "--port", str(self.router_port)],
             [], {"SGLANG_SIM_STATE_DIR": str(self.sim)}, []),
        ]  # fmt: skip
        lines = [*self.supervisor_lines(), *self.gateway_lines]
        for name, role, command, args, gpus, senv, ports in servers:
            if role == "router" and self.gateway_lines:
                continue
            lines += [
                "[[servers]]",
                f"name = {q(name)}",
                f"role = {q(role)}",
                f"command = {json.dumps(command)}",
                f"args = {json.dumps(args)}",
                f"gpus = {gpus}",
                f"gpu_device_paths = {json.dumps([str(self.sim / 'dev' / f'nvidia{g}') for g in gpus])}",
                f"ports = {ports}",
                "startup_budget_s = 120",
                "startup_silence_s = 60",
                "drain_grace_s = 10",
                "[servers.env]",
                *(f"{k} = {q(v)}" for k, v in senv.items()),
                "[servers.probes]",
                *(f"{k} = {json.dumps(v)}" for k, v in self.probes.items()),
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def server_names(self) -> list[str]:
        return ["prefill", "decode"] if self.gateway_lines else ["prefill", "decode", "router"]

    def device_map(self) -> dict[str, list[Path]]:
        return {name: [self.sim / "dev" / f"nvidia{g}"] for g, name in enumerate(("prefill", "decode"))}

    def named(self, name: str) -> dict[str, Any]:
        """One server's status by name."""
        return next(s for s in self.status()["servers"] if s["name"] == name)
