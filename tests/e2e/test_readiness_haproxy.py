"""A real HAProxy in front of two simulated servers under one daemon: with `/servers/<name>/ready` as its check it
takes a wedged server out of rotation at the first check after readiness turns 503, puts it back once the
relaunch is proven, and the other answers every request meanwhile; the same wedge with SGLang's `/health` as the
check, for comparison (the figures are printed; benchmarks/README.md keeps them)."""

from __future__ import annotations

import contextlib
import csv
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.daemon import Deployment, checked, q
from tests.support.ports import free_port
from tests.support.tools import ensure_haproxy
from tests.support.wait import wait_for

CHECK_INTER_MS = 500
WORKERS = 6
WEDGE = {"name": "overlap_tp_desync_hang", "after_requests": 1}
SERVERS = ("alpha", "beta")


@dataclass
class TwoServers(Deployment):
    """Two simulated tp-2 servers (`alpha` on GPUs 0-1, `beta` on 2-3) under one daemon."""

    ports: dict[str, int] = field(default_factory=dict)

    def write(self) -> None:
        self.ports = {"alpha": self.port, "beta": free_port(3)}
        lines = self.supervisor_lines()
        for i, name in enumerate(SERVERS):
            gpus = [2 * i, 2 * i + 1]
            args = [
                "--model-path",
                self.model,
                "--tp-size",
                "2",
                "--enable-metrics",
                "--port",
                str(self.ports[name]),
            ]
            args += ["--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"]
            lines += [
                "[[servers]]",
                f"name = {q(name)}",
                f"command = {json.dumps([sys.executable, '-m', 'simulator.launch_server'])}",
                f"args = {json.dumps(args)}",
                f"gpus = {gpus}",
                f"gpu_device_paths = {json.dumps([str(self.sim / 'dev' / f'nvidia{g}') for g in gpus])}",
                f"ports = [{self.ports[name] + 2}]",
                "startup_budget_s = 120",
                "startup_silence_s = 60",
                "drain_grace_s = 10",
                "[servers.env]",
                *(f"{k} = {q(v)}" for k, v in self.sim_env().items()),
                "[servers.probes]",
                "stall_after_s = 4",
                "stream_canary_period_s = 0",
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def server_names(self) -> list[str]:
        return list(SERVERS)

    def device_map(self) -> dict[str, list[Path]]:
        return {
            name: [self.sim / "dev" / f"nvidia{g}" for g in (2 * i, 2 * i + 1)]
            for i, name in enumerate(SERVERS)
        }


def haproxy_config(dep: TwoServers, front: int, sock: Path, readiness: bool) -> str:
    """A frontend on `front` balancing both servers; checked by the supervisor's readiness, or by /health."""
    if readiness:
        check = [
            "  option httpchk",
            "  http-check send meth GET uri-lf /servers/%[srv_name]/ready",
            "  http-check expect status 200",
            f"  default-server check inter {CHECK_INTER_MS} fall 1 rise 1 port {dep.http_port}",
        ]
    else:
        check = [
            "  option httpchk GET /health",
            "  http-check expect status 200",
            f"  default-server check inter {CHECK_INTER_MS} fall 1 rise 1",
        ]
    return "\n".join(
        [
            "global",
            f"  stats socket {sock} level admin",
            "defaults",
            "  mode http",
            "  timeout connect 1s",
            "  timeout client 30s",
            "  timeout server 4s",
            "  timeout check 3s",
            "  retries 2",
            "  option redispatch",
            "frontend front",
            f"  bind 127.0.0.1:{front}",
            "  default_backend sglang",
            "backend sglang",
            "  balance roundrobin",
            "  http-response set-header X-Served-By %s",
            *check,
            *(f"  server {name} 127.0.0.1:{dep.ports[name]}" for name in SERVERS),
            "",
        ]
    )


class HAProxy:
    """A HAProxy process (foreground, its own session) and its stats socket."""

    def __init__(self, root: Path, dep: TwoServers, readiness: bool) -> None:
        self.front = free_port()
        self.sock = root / f"haproxy-{'ready' if readiness else 'health'}.sock"
        self.config = self.sock.with_suffix(".cfg")
        self.config.write_text(haproxy_config(dep, self.front, self.sock, readiness))
        binary, self.env = ensure_haproxy()
        self.argv = [str(binary), "-f", str(self.config), "-db"]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HAProxy:
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        wait_for(
            lambda: self.state().get("beta") == "UP" and self.state().get("alpha") == "UP", 30, "both UP"
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stats(self) -> dict[str, dict[str, str]]:
        """`show stat` per server of the backend ({} while the socket does not answer)."""
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(self.sock))
            s.sendall(b"show stat\n")
            data = b"".join(iter(lambda: s.recv(65536), b""))
            rows = csv.DictReader(data.decode().lstrip("# ").splitlines())
            return {r["svname"]: r for r in rows if r["pxname"] == "sglang" and r["svname"] in SERVERS}
        return {}

    def state(self) -> dict[str, str]:
        return {name: row["status"].split()[0] for name, row in self.stats().items()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.front}"


@dataclass
class Answer:
    sent: float
    ok: bool
    served_by: str


class Load:
    """Bounded client load through HAProxy: `workers` threads, one request at a time each, at most `limit`."""

    def __init__(self, url: str, model: str, workers: int = WORKERS, limit: int = 4000) -> None:
        self.url, self.limit = url + "/v1/chat/completions", limit
        self.body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        )
        self.answers: list[Answer] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(workers)]

    def _run(self) -> None:
        while not self.stop.is_set() and len(self.answers) < self.limit:
            sent = time.time()
            req = urllib.request.Request(self.url, self.body.encode(), {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    resp.read()
                    self.answers.append(Answer(sent, resp.status == 200, resp.headers.get("X-Served-By", "")))
            except (OSError, urllib.error.URLError) as exc:
                headers = getattr(exc, "headers", None)
                self.answers.append(Answer(sent, False, headers.get("X-Served-By", "") if headers else ""))
            self.stop.wait(0.02)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=15)

    def served(self, name: str, after: float) -> int:
        return sum(1 for a in self.answers if a.ok and a.served_by == name and a.sent > after)

    def failed(self, start: float, end: float) -> int:
        return sum(1 for a in self.answers if not a.ok and start <= a.sent <= end)


def ready_code(dep: TwoServers, name: str) -> int:
    try:
        with urllib.request.urlopen(f"{dep.url}/servers/{name}/ready", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def proven(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving" and not s.get("unproven")


@dataclass
class Wedge:
    """One wedge as the clients, the daemon and HAProxy saw it (wall times, as the daemon's /status gives)."""

    injected: float
    detected: float  # the incident's detected_at
    ready_503: float | None  # readiness first seen 503 (None: the daemon was faster than the first look)
    down: float  # HAProxy's state first seen DOWN
    back: float  # the relaunch serving and proven (its `since`): readiness 200 from then on
    up: float  # HAProxy's state first seen UP again (with /health as the check: maybe before `back`)
    down_check: str  # what HAProxy's check of the server saw when it went DOWN (`L7STS 503`: a readiness 503)
    failed: int  # client requests sent between the wedge and UP that got no 200
    failed_after_detection: int


def wedge(dep: TwoServers, hx: HAProxy, load: Load, name: str) -> Wedge:
    """Wedge `name` under load; follow it out of rotation and back in (proven by the daemon and UP in HAProxy)."""
    other = "beta" if name == "alpha" else "alpha"
    wait_for(lambda: load.served(name, 0) and load.served(other, 0), 30, "load on both")
    first = dep.servers()[name]
    status, _ = dep.post("/sim/fault", WEDGE, base=f"http://127.0.0.1:{dep.ports[name]}")
    assert status == 200
    injected = time.time()
    ready_503 = None
    if ready_code(dep, name) == 200:
        wait_for(lambda: ready_code(dep, name) == 503, 60, f"{name} not ready")
        ready_503 = time.time()
    wait_for(lambda: hx.state().get(name) == "DOWN", 60, f"{name} DOWN in HAProxy")
    down, row = time.time(), hx.stats()[name]
    check = f"{row['check_status']} {row['check_code']}".strip()
    wait_for(lambda: hx.state().get(name) == "UP", 90, f"{name} UP again", interval=0.02)
    up = time.time()
    found = dep.wait_all(
        lambda s: proven(s[name]) and s[name]["pid"] != first["pid"], 90, f"{name} relaunched"
    )
    wait_for(lambda: load.served(name, up), 30, f"{name} serving through HAProxy again")
    detected = float(found[name]["last_incident"]["detected_at"])
    return Wedge(
        injected, detected, ready_503, down, float(found[name]["since"]), up, check,
        load.failed(injected, up), load.failed(detected, up),
    )  # fmt: skip


def test_haproxy_takes_a_wedged_server_out_on_readiness_and_back_after_recovery(tmp_path: Path) -> None:
    """Readiness as the check: out of rotation at the first check after 503, back after the proven relaunch,
    every request sent meanwhile answered by the other; then the same wedge with /health as the check."""
    dep = TwoServers(tmp_path)
    with checked(dep):
        dep.start()
        dep.wait_all(lambda s: all(proven(s[n]) for n in SERVERS), 90, "both serving")
        with HAProxy(tmp_path, dep, readiness=True) as hx, Load(hx.url, dep.model) as load:
            ready = wedge(dep, hx, load, "alpha")
            meanwhile = [a for a in load.answers if ready.down < a.sent < ready.back]
        assert ready.ready_503 is not None and ready.ready_503 <= ready.down <= ready.back <= ready.up
        assert ready.down_check == "L7STS 503", f"taken out by its readiness 503, not {ready.down_check}"
        assert meanwhile and all(a.ok and a.served_by == "beta" for a in meanwhile), [
            a for a in meanwhile if not a.ok or a.served_by != "beta"
        ]
        with HAProxy(tmp_path, dep, readiness=False) as hx, Load(hx.url, dep.model) as load:
            health = wedge(dep, hx, load, "beta")
        print(
            f"\nreadiness turned 503 → HAProxy took the server out: {ready.down - (ready.ready_503 or 0):.2f} s"
        )
        for check, w in (("/servers/NAME/ready", ready), ("/health", health)):
            print(
                f"\n{check:<20} check every {CHECK_INTER_MS} ms, {WORKERS} clients: failed {w.failed} requests"
                f" ({w.failed_after_detection} sent after the supervisor's detection); out of rotation"
                f" {w.down - w.injected:.1f} s after the wedge, {w.down - w.detected:.1f} s after detection;"
                f" back in rotation {w.up - w.back:+.1f} s from the relaunch's proof (canary passed); HAProxy saw"
                f" {w.down_check}"
            )
