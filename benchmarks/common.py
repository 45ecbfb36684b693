"""Shared pieces of the benchmarks: argument parsing, figures, fault injection, oracles, cleanup.

The daemon-plus-simulator harness is `tests/support/daemon.py` (`Deployment`, `Traffic`); this module adds what a
benchmark needs on top: bounded JSON calls to the simulator's control endpoint, the moment a fault started,
the incidents the daemon recorded, a correctness oracle (the canaries' content checks), and a cleanup of every
process that carries a simulator state directory. Benchmarks print figures; nothing here asserts a duration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import psutil

from policies.model import ProbeSettings
from probes.canary import tool_canary
from probes.stream_canary import stream_canary
from tests.support.daemon import ROOT, Deployment, Traffic
from tests.support.ports import free_port

RESULTS = Path(__file__).resolve().parent / "results"
MAX_BODY = 4 * 2**20
MODEL = "moonshotai/Kimi-K2.5"
T = TypeVar("T")
WATCHDOG_SCALED_S = 30  # SGLang's --watchdog-timeout default 300 s, scaled down ten times


@dataclass(frozen=True)
class Scenario:
    """How a fault is armed and driven: `traffic` is "requests" (sequential chats) or "streams" (16 at once)."""

    traffic: str
    extra_args: tuple[str, ...] = ()
    zero_fault: bool = False
    dp: int = 1  # the server's `--dp-size` (each DP rank a TP group of 2 GPUs)

    def deployment(self) -> dict[str, Any]:
        """The `Deployment` keywords of this scenario's server."""
        if self.dp == 1:
            return {"extra_args": list(self.extra_args)}
        args = [*self.extra_args, "--dp-size", str(self.dp)]
        return {"extra_args": args, "local_gpus": 2 * self.dp, "sim_ports": 2 + self.dp}


SCENARIOS: dict[str, Scenario] = {
    "overlap_tp_desync_hang": Scenario("requests"),
    "watchdog_disabled_silent_wedge": Scenario("requests", ("--watchdog-timeout", "1000000")),
    "custom_allreduce_spin_sigterm_immune": Scenario("requests"),
    "zombie_after_cpp_abort": Scenario("requests"),
    "runtime_cuda_oom_crash": Scenario("requests"),
    "tool_markup_leak_under_load": Scenario("streams"),
    "health_false_negative_long_prefill": Scenario("requests", zero_fault=True),
    "dp_rank_wedge": Scenario("requests", dp=2),
}


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with the `--quick` switch every benchmark accepts."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer samples and shorter windows (a smoke run)")
    return p


def summary(values: list[float]) -> dict[str, float | int | None]:
    """n, median, p90, min, max (rounded to ms); None figures when there are no samples."""
    if not values:
        return {"n": 0, "median": None, "p90": None, "min": None, "max": None}
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "median": round(statistics.median(ordered), 3),
        "p90": round(p90, 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
    }


def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write `benchmarks/results/<name>.json` and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def say(text: str) -> None:
    """Progress on stderr (figures go to stdout)."""
    print(text, file=sys.stderr, flush=True)


def wait_for(pred: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T | None:
    """Poll `pred` until it returns something truthy or the deadline passes (then None); errors count as no."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError, psutil.Error):
            value = pred()
            if value:
                return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def get_json(url: str, timeout: float = 5.0) -> Any:
    """GET a JSON document (read at most MAX_BODY bytes)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read(MAX_BODY))


def post_json(url: str, body: dict[str, Any], timeout: float = 10.0) -> tuple[int, Any]:
    """POST JSON; returns (status, parsed body or None)."""
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read(MAX_BODY) or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def http_status(url: str, timeout: float) -> int | None:
    """The status of a GET, or None on refusal / timeout."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read(65536)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def inject(sim_url: str, name: str, **spec: Any) -> None:
    """Arm a fault live through `POST /sim/fault`; raises when the simulator refuses."""
    status, body = post_json(sim_url + "/sim/fault", {"name": name, **spec})
    if status != 200 or not (body or {}).get("armed"):
        raise RuntimeError(f"could not arm {name}: HTTP {status} {body}")


def started_at(sim_url: str, name: str) -> float | None:
    """The wall time the named fault fired, from `GET /sim/state` (None while not fired)."""
    state = get_json(sim_url + "/sim/state", timeout=3)
    for fault in state.get("active", []):
        if fault.get("name") == name and fault.get("started_at"):
            return float(fault["started_at"])
    return None


class FaultClock:
    """Watches `/sim/state` in the background and keeps the fault's start time once seen.

    Crash faults can take the simulator down within milliseconds of firing; then the send time of the first
    request after arming (which is what fires an `after_requests` trigger) stands in for the start.
    """

    def __init__(self, sim_url: str, name: str) -> None:
        self.sim_url, self.name = sim_url, name
        self.seen: float | None = None
        self.armed_at = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.seen is None:
            with contextlib.suppress(OSError, ValueError):
                self.seen = started_at(self.sim_url, self.name)
            self._stop.wait(0.05)

    def __enter__(self) -> FaultClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def start(self, first_request_at: float | None) -> tuple[float | None, str]:
        """The fault start and where it came from."""
        if self.seen is not None:
            return self.seen, "sim_state"
        return first_request_at, "first_request"


class Driver:
    """The traffic a scenario needs, bounded: sequential chats (`Traffic`), or 16-stream bursts every 2 s until
    `until()` holds (the fault fired: the bursts are only its trigger)."""

    def __init__(
        self, sim_url: str, kind: str, max_s: float, until: Callable[[], bool] | None = None
    ) -> None:
        self.sim_url, self.kind, self.max_s, self.until = sim_url, kind, max_s, until
        self.first_at: float | None = None
        self.leaky_rounds = 0
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._streams, daemon=True)
        self._traffic = Traffic(sim_url, MODEL, period_s=0.3, max_requests=int(max_s / 0.3) + 1)

    def __enter__(self) -> Driver:
        self.first_at = time.time()
        if self.kind == "streams":
            self._thread.start()
        else:
            self._traffic.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.kind == "streams":
            self._thread.join(timeout=90)
        else:
            self._traffic.__exit__()

    def _streams(self) -> None:
        deadline = time.monotonic() + self.max_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.rounds and self.until is not None and self.until():
                return
            ok = burst(self.sim_url, 16)
            self.rounds += 1
            self.leaky_rounds += 0 if ok else 1
            self._stop.wait(2.0)


def _settings(concurrency: int = 16) -> ProbeSettings:
    return ProbeSettings(canary_timeout_s=10.0, stream_canary_concurrency=concurrency)


async def _oracle(url: str, streams: bool) -> tuple[bool, str]:
    async with aiohttp.ClientSession() as session:
        single = await tool_canary(session, url, MODEL, _settings())
        if not single.ok or not streams:
            return single.ok, single.detail
        many = await stream_canary(session, url, MODEL, _settings(), True)
        return many.ok, many.detail


def correct(url: str, streams: bool = False) -> tuple[bool, str]:
    """Is the server serving correct output? `/health` 200 and a tool call parsed in stream and non-stream
    (the canaries' content checks), and with `streams` also 16 concurrent streams free of leaked markup."""
    if http_status(url + "/health", timeout=25) != 200:
        return False, "health not 200"
    try:
        return asyncio.run(_oracle(url, streams))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return False, f"{type(exc).__name__}"


def burst(url: str, n: int) -> bool:
    """Send `n` concurrent tool-call streams; True when none leaked markup or broke."""

    async def run() -> bool:
        async with aiohttp.ClientSession() as session:
            return (await stream_canary(session, url, MODEL, _settings(n), True)).ok

    try:
        return asyncio.run(run())
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False


def incidents_since(dep: Deployment, since: float) -> list[dict[str, Any]]:
    """The daemon's incidents detected at or after `since` (wall time), oldest first."""
    found = [i for i in dep.status().get("incidents", []) if float(i.get("detected_at") or 0) >= since]
    return sorted(found, key=lambda i: float(i["detected_at"]))


def marked(sim_dir: Path) -> list[psutil.Process]:
    """Live processes of this simulator state dir: those whose environment names it, and those holding one of
    its stand-in device files (rank titles can hide the environment; a detached rank still holds its GPU)."""
    devices = {str(p) for p in (sim_dir / "dev").glob("nvidia*")}
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("SGLANG_SIM_STATE_DIR") == str(sim_dir) or (
                devices and any(f.path in devices for f in proc.open_files())
            ):
                found.append(proc)
    return found


def kill_marked(sim_dir: Path) -> int:
    """SIGKILL every live process of this state dir (see `marked`); returns how many."""
    procs = marked(sim_dir)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


@contextlib.contextmanager
def bench_deployment(**kw: Any) -> Iterator[Deployment]:
    """A `Deployment` in a temporary directory; the daemon and every simulated process are killed at the end."""
    with tempfile.TemporaryDirectory(prefix="sglsup-bench-") as tmp:
        dep = Deployment(Path(tmp), **kw)
        try:
            yield dep
        finally:
            dep.cleanup()
            kill_marked(dep.sim)


def serving(s: dict[str, Any]) -> bool:
    """The server is in state serving."""
    return s.get("state") == "serving"


class SimHost:
    """Launches the simulator as `python -m simulator.launch_server …` and remembers every launch."""

    def __init__(
        self, root: Path, env: dict[str, str], extra_args: list[str], parsers: bool, watchdog: bool
    ) -> None:
        self.root, self.sim = root, root / "sim"
        self.port = free_port(3)
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["--model-path", MODEL, "--tp-size", "2", "--enable-metrics", "--port", str(self.port)]
        if parsers:
            args += ["--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"]
        if watchdog and "--watchdog-timeout" not in extra_args:
            args += ["--watchdog-timeout", str(WATCHDOG_SCALED_S)]
        self.argv = [sys.executable, "-m", "simulator.launch_server", *args, *extra_args]
        self.env = {
            **os.environ,
            "SGLANG_SIM_STATE_DIR": str(self.sim),
            "SGLANG_SIM_SHM_DIR": str(self.sim / "shm"),
            "SGLANG_SIM_CONTROL": "1",
            "SGLANG_SIM_STARTUP_S": "0.3",
            "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
            "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
            **env,
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        """The latest launch."""
        return self.procs[-1]

    def launch(self) -> None:
        """Start one more server (its own session, output to a log file)."""
        with open(self.root / f"sim-{len(self.procs)}.log", "ab") as log:
            self.procs.append(
                subprocess.Popen(
                    self.argv,
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def term_all(self, grace_s: float) -> None:
        """SIGTERM every process of the run, SIGKILL what is left after `grace_s` (a cgroup/container stop)."""
        procs = marked(self.sim)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        psutil.wait_procs(procs, timeout=grace_s)
        kill_marked(self.sim)

    def stop_main(self, grace_s: float) -> None:
        """SIGTERM the main process, wait up to `grace_s`, then SIGKILL the container (kubelet)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        kill_marked(self.sim)

    def pkill(self, pattern: str) -> int:
        """`pkill -f PATTERN`: SIGTERM to this run's processes whose command line contains it."""
        hit = 0
        for proc in marked(self.sim):
            with contextlib.suppress(psutil.Error):
                if pattern in " ".join(proc.cmdline()):
                    proc.terminate()
                    hit += 1
        return hit

    def close(self) -> None:
        """Kill everything of the run and reap the launches."""
        kill_marked(self.sim)
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def log_tail(self, n: int = 3) -> str:
        """The last lines of the latest launch's output."""
        path = self.root / f"sim-{len(self.procs) - 1}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return " | ".join(line[:160] for line in lines[-n:])
