"""What the fidelity diffs share: one launched server (real or simulated) and the bounded HTTP calls they make to it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from tests.real_serving.support import SCRIPTED, tiny_models
from tests.support.daemon import ROOT
from tests.support.ports import free_port
from tests.support.real_sglang import real_serving_python

READY_S = 900.0
STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z0-9_]+)?\] ")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PATHISH = re.compile(r"/[\w./-]+")


def http_call(
    method: str, url: str, body: dict[str, Any] | None, timeout: float
) -> tuple[int | None, float, str]:
    """(status or None when unanswered, seconds, body up to 1 MiB)."""
    start = time.monotonic()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, time.monotonic() - start, resp.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - start, exc.read(1 << 20).decode(errors="replace")
    except (OSError, urllib.error.URLError):
        return None, time.monotonic() - start, ""


class Target:
    """One launched server (real or simulated): its process, its log, its URL."""

    def __init__(self, kind: str, argv: list[str], env: dict[str, str], port: int, work: Path) -> None:
        self.kind, self.port, self.log_path = kind, port, work / f"{kind}.log"
        self.url = f"http://127.0.0.1:{port}"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def titles(self) -> list[str]:
        """Titles of the tree's processes (`sglang::…`, and `resource_tracker` for that helper)."""
        out = set()
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                line = " ".join(child.cmdline())
                out.add("resource_tracker" if "resource_tracker" in line else line.split(" ")[0])
        return sorted(out)

    def rank(self, title: str) -> psutil.Process:
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if " ".join(child.cmdline()).split(" ")[0] == title:
                    return child
        raise LookupError(f"no {title} under {self.proc.pid}")

    def wait_ready(self) -> dict[str, float | None]:
        """Seconds to the port open and to the first /health 200."""
        opened = ready = None
        deadline = self.started + READY_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            code, _, _ = http_call("GET", self.url + "/health", None, 30)
            now = time.monotonic() - self.started
            opened = opened if opened is not None or code is None else now
            if code == 200:
                ready = now
                break
            time.sleep(0.5)
        if ready is None:
            raise RuntimeError(f"{self.kind} not ready: {self.log_lines()[-20:]}")
        return {"port_open_s": opened, "ready_s": ready}

    def kill(self) -> None:
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def gauge(url: str, name: str) -> float:
    """The sum of a metric's labelled samples."""
    _, _, text = http_call("GET", url + "/metrics", None, 30)
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "{"))


def metric_shapes(text: str) -> dict[str, list[str]]:
    """`{metric name: sorted label names}` for every `sglang:` sample of an exposition."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        name, _, rest = line.partition("{")
        labels = re.findall(r'(\w+)="', rest.partition("}")[0]) if rest else []
        base = re.sub(r"_(bucket|sum|count|total|created)$", "", name.split(" ")[0])
        out.setdefault(base, set()).update(labels)
    return {k: sorted(v) for k, v in sorted(out.items())}


def normalise(line: str) -> str:
    """A log line without its timestamp prefix, with numbers as N and paths as P (so runs compare)."""
    text = STAMP.sub("", line.strip())
    return _NUMBER.sub("N", _PATHISH.sub("P", text))[:160]


def worlds(sim_only: bool, work: Path, section: str) -> Iterator[tuple[str, Path]]:
    """Each world a section profiles ("sim", then "real" unless `sim_only`) with a fresh folder for it under `work`."""
    for kind in ("sim",) if sim_only else ("sim", "real"):
        where = work / f"{section}-{kind}"
        where.mkdir()
        yield kind, where


def scripted_targets(
    sim_only: bool, work: Path, section: str, args: list[str], real_env: dict[str, str] | None = None
) -> Iterator[Target]:
    """The scripted tiny model launched in each world with `args` (on loopback, a fresh port, torch_native attention,
    a small KV pool; the real one on CPU, `real_env` in its environment), one after the other: each is yielded
    running, and the caller kills it before the next."""
    python = real_serving_python()
    model = tiny_models(python) / SCRIPTED
    for kind, where in worlds(sim_only, work, section):
        port = free_port(3)
        module = "simulator.launch_server" if kind == "sim" else "sglang.launch_server"
        argv = [
            sys.executable if kind == "sim" else str(python),
            "-m",
            module,
            "--model-path",
            str(model),
            *args,
        ]
        argv += ["--port", str(port), "--host", "127.0.0.1", "--attention-backend", "torch_native"]
        argv += ["--mem-fraction-static", "0.05", "--max-total-tokens", "4096"]
        if kind == "real":
            argv += ["--device", "cpu", "--load-format", "safetensors"]
            env = dict(real_env or {})
        else:
            env = {"SGLANG_SIM_STATE_DIR": str(where / "sim"), "SGLANG_SIM_SHM_DIR": str(where / "shm")}
        yield Target(kind, argv, env, port, where)
