"""Two simulated servers under one daemon behind a real gateway, and clients that reach them only through it."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support.daemon import Deployment, checked, q
from tests.support.gateways import ADMIN_KEY, Gateway, post_chat
from tests.support.http import http
from tests.support.ports import free_port

NAMES = ("a", "b")
MODEL = "Qwen/Qwen3-8B"


@dataclass
class GatewayDeployment(Deployment):
    """Servers `a` (GPU 0) and `b` (GPU 1), tp 1 each, one daemon, `[gateway]` pointing at `gateway_url`."""

    gateway_url: str = ""
    gateway_extra: dict[str, Any] = field(default_factory=dict)
    names: tuple[str, ...] = (
        NAMES  # this daemon's servers; the first is "a" of the tests (its tp, args, policy)
    )
    a_tp: int = 1  # server a's tp size (a TP desync needs 2)
    a_args: list[str] = field(default_factory=list)  # server a's args in place of the family's parsers
    drives_gateway: bool = True  # False: no [gateway] (the gateway knows the workers by itself)

    def write(self) -> None:
        self.tp, self.model = 1, MODEL
        self.ports = {name: getattr(self, "ports", {}).get(name) or free_port(3) for name in self.names}
        self.port = self.ports[self.names[0]]
        (self.root / "gateway-key").write_text(ADMIN_KEY + "\n")
        lines = self.supervisor_lines()
        if self.drives_gateway:
            lines += [
                "[gateway]",
                f"url = {q(self.gateway_url)}",
                f"admin_key_file = {q(str(self.root / 'gateway-key'))}",
                *(f"{k} = {json.dumps(v)}" for k, v in self.gateway_extra.items()),
            ]
        for name in self.names:
            port, gpus = self.ports[name], self.gpus_of(name)
            parsers = ["--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3"]
            args = [
                "--model-path",
                MODEL,
                "--enable-metrics",
                "--port",
                str(port),
                "--base-gpu-id",
                str(gpus[0]),
            ]
            args += (
                [*(self.a_args or parsers), "--tp-size", str(self.a_tp)] if name == self.names[0] else parsers
            )
            args += self.extra_args
            lines += [
                "[[servers]]",
                f"name = {q(name)}",
                f"command = {json.dumps([sys.executable, '-m', 'simulator.launch_server'])}",
                f"args = {json.dumps(args)}",
                f"gpus = {gpus}",
                f"gpu_device_paths = {json.dumps([str(self.sim / 'dev' / f'nvidia{g}') for g in gpus])}",
                f"ports = [{port + 2}]",
                "startup_budget_s = 120",
                "startup_silence_s = 60",
                "drain_grace_s = 10",
                "[servers.env]",
                *(f"{k} = {q(v)}" for k, v in self.sim_env().items()),
                "[servers.probes]",
                *(f"{k} = {json.dumps(v)}" for k, v in self.probes.items()),
                "[servers.policy]",
                *(
                    f"{k} = {json.dumps(v)}"
                    for k, v in (self.policy if name == self.names[0] else {}).items()
                ),
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def gpus_of(self, name: str) -> list[int]:
        index = self.names.index(name)
        return list(range(self.a_tp)) if index == 0 else [self.a_tp + index - 1]

    def server_names(self) -> list[str]:
        return list(self.names)

    def device_map(self) -> dict[str, list[Path]]:
        return {name: [self.sim / "dev" / f"nvidia{g}" for g in self.gpus_of(name)] for name in self.names}

    def url_of(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def named(self, name: str) -> dict[str, Any]:
        return next(s for s in self.status()["servers"] if s["name"] == name)

    def both_in(self, gateway: Gateway) -> dict[str, str]:
        """Both servers serving and listed by the gateway (URL → id), else {}."""
        live = gateway.live()
        servers = self.servers()
        ok = all(servers.get(n, {}).get("state") == "serving" and self.url_of(n) in live for n in self.names)
        return live if ok else {}

    def events(self, name: str) -> list[dict[str, Any]]:
        """The daemon's log events called `name`, in order."""
        lines = (self.root / "daemon.log").read_text(errors="replace").splitlines()
        found = []
        for line in lines:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
        return found


def ts(event: dict[str, Any]) -> float:
    """An event's wall time (its ISO timestamp) in Unix seconds."""
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def for_server(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("server") == name]


@contextlib.contextmanager
def gateway_deployment(root: Path, gateway: Gateway, **kw: Any) -> Iterator[GatewayDeployment]:
    """A started daemon of two servers behind `gateway`, cleaned up with its invariants checked."""
    dep = GatewayDeployment(root, gateway_url=gateway.url, **kw)
    with checked(dep):
        dep.start()
        yield dep


@dataclass
class Clients:
    """`n` closed-loop clients through the gateway (every other one streaming), 60 s timeout, bounded count."""

    url: str
    n: int = 4
    max_requests: int = 3000
    model: str = MODEL
    rate: float = 0.0  # > 0: open loop, a new request every 1/rate s whatever the others do (real traffic)
    results: list[tuple[float, float, str]] = field(default_factory=list)  # (sent, ended, outcome), wall time

    def __post_init__(self) -> None:
        self.stop = threading.Event()
        loop = self._open if self.rate > 0 else self._run
        self.threads = [threading.Thread(target=loop, args=(i % 2 == 1,), daemon=True) for i in range(self.n)]
        self.sent: list[threading.Thread] = []

    def _one(self, stream: bool) -> None:
        sent = time.time()
        outcome = post_chat(self.url, self.model, stream)
        self.results.append((sent, time.time(), outcome))

    def _open(self, stream: bool) -> None:
        """One open-loop sender: its share of `rate`, each request on a thread of its own."""
        while not self.stop.wait(self.n / self.rate) and len(self.sent) < self.max_requests:
            thread = threading.Thread(target=self._one, args=(stream,), daemon=True)
            self.sent.append(thread)
            thread.start()

    def _run(self, stream: bool) -> None:
        while not self.stop.is_set() and len(self.results) < self.max_requests:
            sent = time.time()
            outcome = post_chat(self.url, self.model, stream)
            self.results.append((sent, time.time(), outcome))
            if outcome != "ok":
                self.stop.wait(0.2)

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in [*self.threads, *self.sent]:
            thread.join(timeout=70)

    def failed(self) -> list[tuple[float, float, str]]:
        return [r for r in self.results if r[2] != "ok"]

    def wait_ok(self, count: int, timeout: float = 60) -> None:
        """Until `count` more requests have succeeded."""
        target = len([r for r in self.results if r[2] == "ok"]) + count
        deadline = time.monotonic() + timeout
        while len([r for r in self.results if r[2] == "ok"]) < target:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"fewer than {count} requests served in {timeout} s: {self.results[-5:]}"
                )
            time.sleep(0.1)


class Dispatches:
    """When the gateway sent requests to each worker URL: SMG's own per-worker counter
    (`smg_worker_requests_total{worker=URL}`, on its Prometheus port), sampled every 0.1 s. A removed worker's
    series vanishes and a re-added one starts again at 0: every rise counts, none is lost to a reset. A rise is
    known only to lie between the sample before it and the one that saw it (a loaded host stretches that span),
    so each is kept as that span."""

    def __init__(self, gateway: Gateway) -> None:
        self.url = f"http://127.0.0.1:{gateway.prometheus_port}/metrics"
        self.spans: dict[str, list[tuple[float, float]]] = {}  # worker URL -> (after, before) of each rise
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last: dict[str, float] = {}
        previous = time.time()
        while not self.stop.wait(0.1):
            with contextlib.suppress(OSError, ValueError):
                asked, seen = time.time(), {}
                for line in http(self.url, timeout=1.0).body.decode().splitlines():
                    if line.startswith("smg_worker_requests_total{") and 'worker="' in line:
                        worker = line.split('worker="', 1)[1].split('"', 1)[0]
                        seen[worker] = float(line.rsplit(" ", 1)[1])
                now = time.time()
                for worker, count in seen.items():
                    if count > last.get(worker, 0.0):
                        self.spans.setdefault(worker, []).append((previous, now))
                last, previous = seen, asked  # the next rise came after this count was read

    def between(self, url: str, start: float, end: float) -> list[tuple[float, float]]:
        """The rises of `url`'s count certainly within [start, end] (wall time): their whole span inside it."""
        return [(lo, hi) for lo, hi in self.spans.get(url, []) if start <= lo and hi <= end]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
