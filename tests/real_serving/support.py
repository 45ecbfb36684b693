"""The daemon supervising the real SGLang server on CPU: config, tiny models, requests in flight, rank lookup."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support.daemon import Deployment, checked, q, toml_value
from tests.support.gateways import Gateway
from tests.support.real_sglang import RealSglangError, cache_root
from tests.support.wait import wait_for

BUILDER = Path(__file__).resolve().parent / "build_models.py"
SCRIPTED = "scripted-qwen2.5"  # answers every prompt with get_weather({"city": "Paris"}) in Qwen markup
SCRIPTED_REASONING = "scripted-qwen3"  # the same, and <think>…</think>42 when thinking is on
READY_S = 900.0  # the real server on 2 busy shared cores: ~30-200 s to ready, per launch
# Fast probes so the tier costs minutes, not hours; the canary runs once per launch (its period is long).
# stall_after_s stays above the product default (20): the real server's first forward compiles (torch inductor)
# and on a busy CPU SGLang's own warmup request makes no token progress for longer than that.
PROBES: dict[str, Any] = {
    "health_period_s": 2,
    "health_timeout_s": 30,
    "stall_after_s": 30,
    "metrics_period_s": 1,
    "canary_period_s": 3600,
    "canary_timeout_s": 120,
    "stream_canary_concurrency": 1,
    "stream_canary_period_s": 3600,
}

# The product defaults but the load canary: its streams ask for different cities and the scripted models answer
# Paris to every prompt, a false `stream_leak` (alert-only) that only these models make.
NO_LOAD_CANARY: dict[str, Any] = {"stream_canary_period_s": 0}


def tiny_models(python: Path, timeout_s: float = 600) -> Path:
    """Build the models with the serving venv's interpreter into a cache dir keyed by the builder's hash."""
    digest = hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]
    out = cache_root() / f"models-{digest}"
    done = out / ".complete"
    if done.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the build takes seconds; a second pytest waits for it
        if not done.is_file():
            try:
                run = subprocess.run(
                    [str(python), str(BUILDER), str(out)],
                    capture_output=True,
                    text=True,
                    timeout=timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise RealSglangError(f"building the tiny models took over {timeout_s} s") from None
            if run.returncode != 0:
                raise RealSglangError(f"building the tiny models failed:\n{run.stderr[-3000:]}")
            done.write_text(digest + "\n")
    return out


@dataclass
class RealDeployment(Deployment):
    """One real SGLang server (CPU, tiny model) under the daemon, with fast probes."""

    python: Path = Path(sys.executable)
    models: Path = Path()
    model_name: str = SCRIPTED
    name: str = "real"
    tuned_probes: bool = True  # False: the product's default probe settings (only `probes` overrides them)
    gateway_lines: list[str] = field(default_factory=list)  # a `[gateway]` table (SGLang's gateway in front)
    gateway: Gateway | None = None  # that gateway, when the test started one

    @property
    def model_dir(self) -> Path:
        return self.models / self.model_name

    def write(self) -> None:
        args = ["--model-path", str(self.model_dir), "--tp-size", str(self.tp), "--host", "127.0.0.1"]
        args += ["--port", str(self.port), "--device", "cpu", "--attention-backend", "torch_native"]
        args += ["--mem-fraction-static", "0.05", "--max-total-tokens", "4096", "--enable-metrics"]
        load = "dummy" if self.model_name.startswith("random") else "safetensors"
        args += ["--load-format", load]
        if self.parsers[0]:
            args += ["--tool-call-parser", self.parsers[0]]
        if self.parsers[1]:
            args += ["--reasoning-parser", self.parsers[1]]
        args += self.extra_args
        env = {
            # Unique to the test: `ours()` and `cleanup()` find every process of this deployment by it.
            "SGLANG_SIM_STATE_DIR": str(self.sim),
            **(
                {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(i) for i in range(self.tp))}
                if self.tp > 1
                else {}
            ),
            **self.env,
        }
        lines = [
            *(line.replace('"sim"', '"none"') for line in self.supervisor_lines()),
            *self.gateway_lines,
            "[[servers]]",
            f"name = {q(self.name)}",
            f"command = {json.dumps([str(self.python), '-m', 'sglang.launch_server'])}",
            f"args = {json.dumps(args)}",
            f"startup_budget_s = {READY_S}",
            f"startup_silence_s = {READY_S}",
            "drain_grace_s = 20",
            "[servers.env]",
            *(f"{k} = {q(v)}" for k, v in env.items()),
            "[servers.probes]",
            *(
                f"{k} = {json.dumps(v)}"
                for k, v in {**(PROBES if self.tuned_probes else {}), **self.probes}.items()
            ),
            "[servers.policy]",
            *(f"{k} = {toml_value(v)}" for k, v in self.policy.items()),
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def incidents(self) -> list[dict[str, Any]]:
        """`GET /incidents` of the daemon."""
        with urllib.request.urlopen(self.url + "/incidents", timeout=5) as resp:
            data = json.loads(resp.read())
        return list(data["incidents"] if isinstance(data, dict) else data)

    def ranks(self, pid: int) -> dict[str, psutil.Process]:
        """The real tree's processes under main `pid`, by title (`sglang::scheduler_TP1`, ...)."""
        out = {}
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                title = " ".join(child.cmdline())
                if title.startswith("sglang::"):
                    out[title.split()[0]] = child
        return out


@contextlib.contextmanager
def one_real_server_at_a_time(timeout_s: float = 3600) -> Iterator[None]:
    """An fcntl lock across pytest workers: a real server at a time (two on 2 cores starve each other)."""
    lock = cache_root() / "real-serving.run.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"another worker held {lock} for {timeout_s:.0f} s") from None
                time.sleep(0.5)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def real_deployment(root: Path, **kw: Any) -> Iterator[RealDeployment]:
    """A real deployment that is always cleaned up; one runs at a time across workers."""
    with one_real_server_at_a_time():
        dep = RealDeployment(root, **kw)
        with checked(dep):
            yield dep


def serving(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving"


def serving_again(dep: RealDeployment, old_pid: int, what: str) -> dict[str, Any]:
    """Wait for `serving` under a main PID other than `old_pid`."""
    return dep.wait(lambda s: serving(s) and s["pid"] != old_pid, timeout=READY_S, what=what)


def port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:`port` (SO_REUSEADDR, as SGLang's server binds: TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class InFlight:
    """`n` long `/generate` requests (EOS ignored) kept in flight on a thread each; bounded by their timeout."""

    def __init__(
        self,
        base_url: str,
        n: int = 2,
        tokens: int = 3000,
        timeout_s: float = 600,
        routed_dp_rank: int | None = None,
    ) -> None:
        body: dict[str, Any] = {
            "text": "hello",
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
        if routed_dp_rank is not None:
            body["routed_dp_rank"] = routed_dp_rank
        self.req = urllib.request.Request(
            base_url + "/generate",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        self.timeout_s = timeout_s
        self.threads = [threading.Thread(target=self._one, daemon=True) for _ in range(n)]

    def _one(self) -> None:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            urllib.request.urlopen(self.req, timeout=self.timeout_s).read()

    def __enter__(self) -> InFlight:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self.threads:
            thread.join(timeout=1)


def generate(base_url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST /generate to the real server and return its JSON (slow on busy CPUs: the caller sets the timeout)."""
    req = urllib.request.Request(
        base_url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return dict(json.loads(resp.read()))


def metric(base_url: str, name: str) -> float:
    """The sum of one metric's samples on the server's /metrics (0 when absent)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def wait_running(base_url: str, n: int, timeout: float) -> None:
    """Poll until the server reports at least `n` running requests."""

    def running() -> bool:
        with contextlib.suppress(OSError, ValueError):
            return metric(base_url, "sglang:num_running_reqs") >= n
        return False

    wait_for(running, timeout, f"at least {n} requests running", interval=0.2)


def pids_alive(pids: set[int]) -> set[int]:
    """Which of `pids` still exist as non-zombie processes."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
    return alive
