"""SGLang's real gateways for the gateway tier: SMG 1.13.0 and sglang-router 0.3.2 from PyPI, installed once into a
venv cached beside the real-SGLang venvs (`gateway-<hash12>`, keyed by `requirements-gateway.txt`), started on
loopback by the tests and stopped by them on every exit path.

Both wheels install a `smg` script (the router's is its own gateway); the tests start each as a module:
`python -m smg launch` and `python -m sglang_router.launch_router`.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import free_port
from tests.support.real_sglang import RealSglangError, cache_root
from tests.support.wait import wait_for

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements-gateway.txt"
SMOKE = "import smg, sglang_router"
ADMIN_KEY = "gw-admin-s3cret"
KINDS = ("smg", "router")
PR_SET_PDEATHSIG = 1


def gateway_python(timeout_s: float = 900) -> Path:
    """The cached gateway venv's interpreter, installed first (under a lock) when missing."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    target = cache_root() / f"gateway-{digest}"
    python, marker = target / "bin" / "python", target / ".install-complete"
    if marker.is_file() and python.exists():
        return python
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            shutil.rmtree(target, ignore_errors=True)
            steps = [
                [sys.executable, "-m", "venv", str(target)],
                [str(python), "-m", "pip", "install", "--no-input", "-q", "-r", str(REQUIREMENTS)],
                [str(python), "-c", SMOKE],
            ]
            for argv in steps:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
                if done.returncode != 0:
                    raise RealSglangError(f"gateway venv: {' '.join(argv)}\n{done.stderr[-3000:]}")
            marker.write_text(digest + "\n")
    return python


@dataclass
class Gateway:
    """One gateway process on loopback: SMG or sglang-router, with an admin key and round-robin routing."""

    kind: str
    log_path: Path
    port: int = field(default_factory=free_port)
    prometheus_port: int = field(default_factory=free_port)
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        python = str(gateway_python())
        head = (
            [python, "-m", "smg", "launch"]
            if self.kind == "smg"
            else [python, "-m", "sglang_router.launch_router"]
        )
        auth = ["--control-plane-api-keys", f"k1:supervisor:admin:{ADMIN_KEY}"]
        ports = ["--host", "127.0.0.1", "--port", str(self.port), "--prometheus-host", "127.0.0.1"]
        return [
            *head,
            *ports,
            "--prometheus-port",
            str(self.prometheus_port),
            "--policy",
            "round_robin",
            *auth,
            *self.extra,
        ]

    def start(self) -> Gateway:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=_env(),
                preexec_fn=_die_with_parent,
            )
        wait_for(self._answers, 60, f"{self.kind} answering on {self.url}", interval=0.2)
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.kind} exited: {self.log_path.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            return self.workers() is not None
        return False

    def workers(self) -> list[dict[str, Any]]:
        """`GET /workers` with the admin key (SMG beside a real PD pair on 2 busy cores once took over 5 s)."""
        req = urllib.request.Request(self.url + "/workers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return list(json.loads(resp.read())["workers"])

    def live(self) -> dict[str, str]:
        """URL → worker id of every worker that takes requests (SMG's `draining` ones left out)."""
        return {w["url"]: w["id"] for w in self.workers() if w.get("status") != "draining"}

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies, however it ends (a runner's timeout too),
    so no gateway outlives the run that started it (SIGTERM would start SMG's own 180 s shutdown grace)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _env() -> dict[str, str]:
    """No proxy, no hub download attempts: everything stays on loopback."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return {**env, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}


@contextlib.contextmanager
def running_gateway(kind: str, root: Path, extra: list[str] | None = None) -> Iterator[Gateway]:
    """A started gateway that is stopped however the body ends."""
    gateway = Gateway(kind, root / f"{kind}-{time.monotonic_ns()}.log", extra=extra or [])
    try:
        yield gateway.start()
    finally:
        gateway.stop()


def post_chat(url: str, model: str, stream: bool, timeout_s: float = 60.0) -> str:
    """One chat completion through `url`: 'ok', or why it failed (a client's view, 60 s timeout like real ones)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 24}
    body["stream"] = stream
    req = urllib.request.Request(
        url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            text = resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return f"{type(exc).__name__}: {exc}"
    if stream and ('"error"' in text or "[DONE]" not in text):
        return f"stream cut: {text[-200:]}"
    return "ok"
