"""Fakes for the server loop's seams: a clock that advances on sleep, a host that records, scripted probes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.flagcompat import FlagSet
from policies.model import Observation, ProbeSettings
from supervisor.config import Config, parse_config
from supervisor.daemon import Daemon
from supervisor.host.adopt import AdoptionView
from supervisor.host.flaghelp import HelpUnavailable
from supervisor.host.forensics import Evidence
from supervisor.host.launcher import SpawnFailed
from supervisor.host.proctree import ProcId, RankState, TreeEvent, TreeSnapshot
from supervisor.host.release import ReleaseReport
from supervisor.loop.commands import Command
from supervisor.loop.host import MonitorSpec, RunHandle
from supervisor.loop.server import ServerLoop
from supervisor.records.incident import Incident


class FakeClock:
    """Monotonic time that moves only when the loop sleeps (each sleep yields to the event loop once)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1.7e9 + self.t

    async def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)
        await asyncio.sleep(0)


class FakeRun:
    """A launched tree: alive until the test kills it."""

    def __init__(self, pid: int, argv: Sequence[str], titles: int) -> None:
        self.pid = pid
        self.pgid = pid
        self.argv = list(argv)
        self.exit_code: int | None = None
        self.lost: set[str] = set()
        self.lines: list[str] = []
        self.closed = False

    def tail(self, n: int) -> list[str]:
        return self.lines[-n:]

    def lines_since(self, cursor: int) -> tuple[list[str], int]:
        return self.lines[cursor:], len(self.lines)

    def returncode(self) -> int | None:
        return self.exit_code

    def output_ended(self) -> bool:
        return self.exit_code is not None

    def close(self, timeout_s: float = 2.0) -> bool:
        self.closed = True
        return True

    def log_offset(self) -> int:
        return len(self.lines)


class FakeMonitor:
    """Probes whose observations the test scripts: `script(now)` returns what this tick saw."""

    def __init__(self, spec: MonitorSpec, script: Callable[[float], list[Observation]]) -> None:
        self.spec = spec
        self.settings = spec.settings
        self.script = script
        self.observations: list[Observation] = []
        self.closed = False
        self.ready = asyncio.Event()
        self.pd_lease_restarts: list[float] = []
        self.aborted_rids: list[str] = []

    async def tick(self, now: float) -> list[Observation]:
        new = self.script(now)
        self.observations += new
        return new

    def window(self) -> list[Observation]:
        return list(self.observations)

    def next_due(self) -> float:
        return math.inf  # scripted: every tick of tick_s observes

    def latest(self, probe: str) -> Observation | None:
        return max((o for o in self.observations if o.probe == probe), key=lambda o: o.at, default=None)

    def reset(self, now: float) -> None:
        self.observations = []

    def reconfigure(self, settings: ProbeSettings) -> None:
        self.settings = settings

    def note_abort(self, now: float, rids: Sequence[str] = ()) -> None:
        if rids:
            self.aborted_rids.extend(rids)
        else:
            self.pd_lease_restarts.append(now)

    def snapshot(self) -> dict[str, Any]:
        return {"probes": {o.probe: {"ok": o.ok, "values": dict(o.values)} for o in self.observations}}

    async def aclose(self) -> None:
        self.closed = True


def healthy(now: float) -> list[Observation]:
    """A server that answers /health 200 and passes the tool canary."""
    return [
        Observation("health", now, True, "/health 200", 0.01, {"status": 200}),
        Observation("canary_tool", now, True, "pass", 0.1, {"verdict": "pass"}),
        Observation("canary_reasoning", now, True, "pass", 0.1, {"verdict": "pass"}),
    ]


@dataclass
class FakeHost:
    """Records every effect; the test decides what the host shows."""

    titles: int = 2
    script: Callable[[float], list[Observation]] = healthy
    spawn_error: str = ""
    release_ok: bool = True
    spawning: set[str] = field(default_factory=set)  # rank titles a new run has not spawned yet
    foreign_gpu: list[str] = field(default_factory=list)  # holders of the GPUs that are not of the run
    server_info_problem: str | None = None
    release_misses: int = 0  # the next releases that say "released" and leave every process alive
    leftovers: list[ProcId] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    runs: list[FakeRun] = field(default_factory=list)
    monitors: list[FakeMonitor] = field(default_factory=list)
    releases: list[dict[str, Any]] = field(default_factory=list)
    forensics_taken: list[str] = field(default_factory=list)
    scripts: dict[str, Callable[[float], list[Observation]]] = field(default_factory=dict)  # by server name
    aborts: list[str] = field(default_factory=list)  # base URLs whose requests were aborted
    abort_error: str = ""

    async def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        gpus: Sequence[int],
        run_id: str,
        marker: str,
        log_path: Path,
    ) -> RunHandle | SpawnFailed:
        if self.spawn_error:
            return SpawnFailed(self.spawn_error)
        run = FakeRun(4000 + len(self.runs), argv, self.titles)
        run.lost |= self.spawning
        self.runs.append(run)
        return run

    @property
    def run(self) -> FakeRun:
        return self.runs[-1]

    async def poll_tree(
        self, previous: TreeSnapshot | None, main_pid: int, run_id: str, titles: Sequence[str]
    ) -> tuple[TreeSnapshot, list[TreeEvent]]:
        run = next(r for r in self.runs if r.pid == main_pid)
        ranks = tuple(
            RankState(
                t, None if t in run.lost else main_pid + 1 + i, "missing" if t in run.lost else "running", 1.0
            )
            for i, t in enumerate(titles)
        )
        snap = TreeSnapshot(0.0, main_pid, run.exit_code is None, ranks, (), ())
        events: list[TreeEvent] = []
        if previous is not None and previous.main_alive and not snap.main_alive:
            events.append(TreeEvent("main_exited", main_pid))
        before = {r.title: r.status for r in previous.ranks} if previous else {}
        events += [
            TreeEvent("rank_lost", 0, r.title)
            for r in ranks
            if r.status != "running" and before.get(r.title, "running") == "running"
        ]
        return snap, events

    async def find_marked(self, marker: str) -> list[ProcId]:
        return list(self.leftovers)

    async def identity(self, run: Any) -> dict[str, Any]:
        return {"pid": run.pid, "pgid": run.pgid, "start_ticks": 1, "boot_id": "fake-boot"}

    async def attach(
        self, identity: dict[str, Any], marker: str, run_id: str, log_path: str, offset: int | None
    ) -> Any:
        """A run of an earlier daemon still alive (the test put it in `runs`), else why not."""
        for run in self.runs:
            if run.pid == identity.get("pid") and run.exit_code is None:
                run.closed = False
                return run
        return f"pid {identity.get('pid')} gone"

    async def adoption_view(self, cfg: Any, pid: int, run_id: str, marker: str, titles: list[str]) -> Any:
        run = next(r for r in self.runs if r.pid == pid)
        return AdoptionView(tuple(sorted(run.lost)), tuple(self.foreign_gpu), self.server_info_problem)

    async def earlier_run(self, marker: str, cfg: Any) -> list[str]:
        """Leftovers and every launched tree not yet killed (what a real marker scan would find)."""
        alive = [f"pid {r.pid}" for r in self.runs if r.exit_code is None]
        return [f"pid {p.pid}" for p in self.leftovers] + alive

    async def wait_exit(
        self, pids: Sequence[int], timeout: float, clock: Any, wake: asyncio.Event | None = None
    ) -> None:
        await clock.sleep(timeout)

    async def foreign_port_holders(self, cfg: Any) -> list[str]:
        return list(self.foreign)

    async def release(self, cfg: Any, sup: Any, **kw: Any) -> ReleaseReport:
        self.releases.append(kw)
        if self.release_misses:  # reports success, kills nothing
            self.release_misses -= 1
            return ReleaseReport(True, "released", {"total": 0.01})
        for run in self.runs:
            if (run.pid == kw.get("main_pid") or kw.get("any_run_of")) and run.exit_code is None:
                run.exit_code = -9
        self.leftovers = []
        if self.release_ok:
            return ReleaseReport(True, "released", {"total": 0.01})
        return ReleaseReport(False, "GPU 0 still held by pid 77")

    def gpu_reader(self, gpus: Sequence[int]) -> Callable[[], list[dict[str, Any]]] | None:
        return None

    async def forensics(self, sup: Any, evidence: Evidence, incident: Incident) -> str:
        self.forensics_taken.append(incident.id)
        return f"/forensics/{incident.id}"

    async def learn_flags(self, command: Sequence[str], cache: Path) -> FlagSet | HelpUnavailable:
        return HelpUnavailable("fake host: flags not learned")

    async def abort_requests(
        self, base_url: str, api_key: str | None, timeout_s: float, rids: Sequence[str] = ()
    ) -> str:
        self.aborts.append(base_url + "".join(f" {rid}" for rid in rids))
        return self.abort_error

    def monitor(self, spec: MonitorSpec) -> FakeMonitor:
        monitor = FakeMonitor(spec, lambda now: self.scripts.get(spec.server, self.script)(now))
        self.monitors.append(monitor)
        return monitor


RESTART = {"initial_s": 1, "max_s": 8, "jitter": 0, "restarts": 3, "window_s": 600, "slow_retry_s": 0}


def config(
    tmp_path: Path,
    extra: str = "",
    server: str = "",
    servers: str | None = None,
    restart: dict[str, float] | None = None,
) -> Config:
    """A one-server config (or `servers` TOML) in `tmp_path`, with fast backoff (`restart` overrides it)."""
    import tomllib

    restart_toml = "\n".join(f"{k} = {v}" for k, v in {**RESTART, **(restart or {})}.items())

    body = f"""
[supervisor]
state_dir = "{tmp_path / "state"}"
log_dir = "{tmp_path / "log"}"
shm_dir = "{tmp_path / "shm"}"
gpu_backend = "none"
tick_s = 0.5
[supervisor.http]
port = 0
[supervisor.restart]
{restart_toml}
{extra}
"""
    body += (
        servers
        if servers is not None
        else f"""
[[servers]]
name = "sim"
command = ["{sys.executable}", "-m", "simulator.launch_server"]
args = ["--model-path", "Qwen/Qwen3-8B", "--tool-call-parser", "qwen", "--reasoning-parser", "qwen3",
        "--tp-size", "2", "--port", "31999"]
gpus = [0, 1]
{server}
"""
    )
    return parse_config(tomllib.loads(body), tmp_path, {})


def daemon(tmp_path: Path, host: FakeHost, clock: FakeClock, **kw: Any) -> Daemon:
    """A daemon over the fakes (nothing is started until the test runs a loop)."""
    return Daemon(config(tmp_path, **kw), host=host, clock=clock)


async def until(cond: Callable[[], bool], steps: int = 20000) -> None:
    """Yield to the loop until `cond()` holds (a bounded number of steps: fake time moves meanwhile)."""
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


@contextlib.asynccontextmanager
async def running(d: Daemon, name: str | None = None) -> AsyncIterator[ServerLoop]:
    """Run the daemon's first server loop (or the one named); stop it cleanly at the end."""
    loop = next(lp for lp in d.loops if name in (None, lp.name))
    task = asyncio.create_task(loop.run_forever())
    try:
        yield loop
    finally:
        loop.stopping = True
        loop.commands.put_nowait(Command("stop", "test over", "test"))
        await asyncio.wait_for(task, timeout=10)
