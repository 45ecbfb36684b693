"""Every documented setting × every fault kind, on the fake host: one tree per server at every instant, no
internal error, an end state the plan explains, nothing alive after stop (docs/config.md; DESIGN §2, §5).

Each case runs all the daemon's server loops on fake time with one setting changed from the fake config's
defaults, injects one fault kind into one server — on its first launch only (`once`) or on every launch
(`recurs`) — until nothing changes any more (or a bounded span), stops, and checks what an operator relies on.
`[group]` needs etcd: group membership is covered by the etcd tier (tests/etcd/test_group_daemons.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import sys
import tomllib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest

from policies.model import Observation, ProbeSettings
from policies.pd import Role
from policies.states import FaultKind, ServerState
from supervisor.config import Config, parse_config
from supervisor.config.models import PolicyConfig, ProbesConfig
from supervisor.daemon import Daemon
from supervisor.host.launcher import SpawnFailed
from supervisor.host.release import ReleaseReport
from supervisor.loop.commands import Command
from supervisor.loop.host import MonitorSpec, RunHandle
from tests.unit.loop_fakes import FakeClock, FakeHost, FakeMonitor, FakeRun

pytestmark = pytest.mark.unit
S = ServerState
TICK_S = 5.0  # the loops' tick: each tick of a launch answers /health and the metrics
CANARY_EVERY = 3  # ... and every third tick the canaries
FAULT_TICK = 4  # a fault that strikes a serving launch does so at this tick of it
SPAN_S = 900.0  # fake seconds a case runs at most: a recurring fault spends the budget well within it
SETTLE_S = (
    150.0  # a case ends once nothing changed this long (beyond every delay of a rule or a setting here)
)
KEEP_S = 150.0  # the scripted window, pruned as the real monitor's is (beyond unresponsive_after_s)
STEPS = 400_000  # event-loop turns a case may take (a loop that stops moving fake time fails the case)
KINDS = [k.value for k in FaultKind]
RESTART = {"initial_s": 1, "max_s": 8, "jitter": 0, "restarts": 3, "window_s": 600, "slow_retry_s": 0}


@dataclass(frozen=True)
class Setting:
    """Documented values that differ from the fake config's defaults; `role` is the server the fault hits."""

    probes: Mapping[str, Any] = field(default_factory=dict)
    policy: Mapping[str, Any] = field(default_factory=dict)
    restart: Mapping[str, Any] = field(default_factory=dict)
    role: str = "unified"
    model: str = "Qwen/Qwen3-8B"
    parsers: bool = True  # the args name the family's parsers

    @property
    def canary_mode(self) -> str:
        return str(self.probes.get("canary_mode", "require"))

    @property
    def restarts(self) -> int:
        return int({**RESTART, **self.restart}["restarts"])


SETTINGS = {
    "defaults": Setting(),
    "canary_mode=advisory": Setting(probes={"canary_mode": "advisory"}),
    "canary_mode=off": Setting(probes={"canary_mode": "off"}),
    "parser_policy=alert": Setting(policy={"parser_policy": "alert"}),
    "expected_parsers=none": Setting(
        probes={"expected_tool_parser": "none", "expected_reasoning_parser": "none"}, parsers=False
    ),
    "expected_parsers=auto,family_unknown": Setting(model="/models/my-finetune"),
    "parser_policy=fix,args_without_parsers": Setting(parsers=False),  # fixed before the first launch
    "role=prefill": Setting(role="prefill"),
    "role=decode": Setting(role="decode"),
    "role=router": Setting(role="router"),
    "restarts=0": Setting(restart={"restarts": 0}),
    "restarts=1": Setting(restart={"restarts": 1}),
    "slow_retry_s=60": Setting(restart={"restarts": 1, "slow_retry_s": 60}),
    "initial_s=0,immediate_first=false": Setting(restart={"initial_s": 0, "immediate_first": False}),
    "stream_canary_period_s=0": Setting(probes={"stream_canary_period_s": 0}),
    "stream_canary_first_s=0": Setting(probes={"stream_canary_first_s": 0}),
    "health_failures=1": Setting(probes={"health_failures": 1}),
    "promote_back=true": Setting(policy={"promote_back": True, "promote_after_s": 60}),
}


# ---- the config ----------------------------------------------------------------------------------------------
def _table(values: Mapping[str, Any]) -> str:
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


def _server(name: str, role: str, gpus: list[int], args: list[str], s: Setting) -> str:
    module = "simulator.launch_router" if role == "router" else "simulator.launch_server"
    command = [sys.executable, "-m", module]
    return (
        f'[[servers]]\nname = "{name}"\nrole = "{role}"\ncommand = {json.dumps(command)}\n'
        f"args = {json.dumps(args)}\ngpus = {gpus}\nstartup_budget_s = 120\nstartup_silence_s = 40\n"
        f"[servers.probes]\n{_table(s.probes)}[servers.policy]\n{_table(s.policy)}"
    )


def _worker_args(s: Setting, port: int, mode: str | None = None) -> list[str]:
    args = ["--model-path", s.model, "--tp-size", "2", "--port", str(port)]
    if s.parsers:
        args += ["--tool-call-parser", "qwen", "--reasoning-parser", "qwen3"]
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    if mode == "prefill":
        args += ["--disaggregation-bootstrap-port", "31901"]
    return args


def build(tmp_path: Path, s: Setting) -> Config:
    """The daemon's config with the setting `s`: one unified server, or prefill + decode + router."""
    body = (
        f'[supervisor]\nstate_dir = "{tmp_path / "state"}"\nlog_dir = "{tmp_path / "log"}"\n'
        f'shm_dir = "{tmp_path / "shm"}"\ngpu_backend = "none"\ntick_s = {TICK_S}\n'
        f"[supervisor.http]\nport = 0\n[supervisor.restart]\n{_table({**RESTART, **s.restart})}"
    )
    if s.role == "unified":
        body += _server("sim", "unified", [0, 1], _worker_args(s, 31000), s)
    else:
        router = ["--pd-disaggregation", "--prefill", "http://127.0.0.1:31001", "31901"]
        router += ["--decode", "http://127.0.0.1:31002", "--host", "127.0.0.1", "--port", "31000"]
        body += _server("prefill", "prefill", [0, 1], _worker_args(s, 31001, "prefill"), s)
        body += _server("decode", "decode", [2, 3], _worker_args(s, 31002, "decode"), s)
        body += _server("router", "router", [], router, s)
    return parse_config(tomllib.loads(body), tmp_path, {})


# ---- the host: one per daemon, every run tagged with its server ---------------------------------------------
def observe(
    kind: str,
    tick: int,
    run: FakeRun,
    settings: ProbeSettings,
    router: bool,
    now: float,
    aborted: bool = False,
) -> list[Observation]:
    """What one tick of a launch shows: healthy, or — from `FAULT_TICK` on, from the start for the startup kinds —
    the fault `kind`: a tree loss through `run`, the rest through the probes that run with these settings."""

    def obs(probe: str, ok: bool, detail: str, **values: Any) -> Observation:
        return Observation(probe, now, ok, detail, 0.01, values)

    if kind == "startup_failure" and tick == 1:
        run.lines.append("Fatal Python error: Bus error")
        run.exit_code = 1
    if kind in ("startup_failure", "startup_stalled"):
        return [obs("health", False, "refused", refused=True)]
    striking = kind if tick >= FAULT_TICK else ""
    if striking in ("crash", "oom") and run.exit_code is None:
        oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        run.lines.append(oom if kind == "oom" else "Scheduler hit an exception:")
        run.exit_code = 1
    found = [obs("health", True, "/health 200", status=200)]
    paused = striking == "pause_overrun" and not router  # a router has no engine to pause
    if striking == "health_unresponsive" or paused:  # a probe that timed out took its whole timeout
        found = [Observation("health", now, False, "timeout", settings.health_timeout_s, {"status": None})]
    if router:  # its canary goes through it to the pair
        if settings.canaries_on and tick % CANARY_EVERY == 0:
            found.append(obs("canary_tool", True, "pass", verdict="pass"))
        return found
    work: dict[str, Any] = {"work": False, "stalled_s": 0.0, "pd_stalled_s": 0.0}
    if striking in ("decode_wedge", "collective_hang", "pause_overrun"):
        work = {"work": True, "stalled_s": 60.0, "work_reasons": ["generation_requests_active"]}
    if (
        striking == "pause_overrun"
    ):  # paused by its client past max_pause_s, requests waiting, /health failing
        since = now - settings.max_pause_s - 1
        found.append(obs("engine", True, "paused", ready=503, ping=200, paused=True, paused_since=since))
    if striking == "pd_transfer_wedge":
        work = {"work": True, "stalled_s": 0.0, "pd_stalled_s": 60.0, "pd_queue": 3}
    if striking == "request_stuck":  # one request far past its peers (there after its abort), the rest served
        work["last_progress_at"] = now
        stuck = {"rid": "r1", "age_s": 1e4, "max_new_tokens": 16, "finished_since": 50}
        stuck["aborted_s"] = 60.0 if aborted else None
        found.append(obs("requests", True, "stuck", oldest=[stuck], p99_e2e_s=1.0, aborts=int(aborted)))
    if striking == "brownout":  # the queue only growing, the batch pinned, throughput a tenth of its baseline
        load = {"span_s": 200.0, "pinned": True, "queue": 40.0, "queue_grew": 30.0, "queue_dip": 0.0}
        found.append(
            obs("load", True, "brownout", running=2.0, tokens_per_s=5.0, baseline_tokens_per_s=50.0, **load)
        )
    found.append(obs("progress", True, "progress", **work))
    if striking == "collective_hang":
        frames = {"TP0": {"collective": "broadcast"}, "TP1": {"collective": "all_reduce"}}
        found.append(obs("stacks", True, "stacks", ranks=frames, diverging=True, all_in=None))
    if striking == "gpu_fault":
        found.append(obs("gpu", False, "Xid 79", xids=[{"index": 0, "xid": 79}], spin=[]))
    due = tick % CANARY_EVERY == 0
    if settings.canaries_on and (due or striking == "parser_misconfig"):
        verdict = "fail" if striking == "parser_misconfig" else "pass"
        found.append(obs("canary_tool", verdict == "pass", verdict, verdict=verdict))
        found.append(obs("canary_reasoning", True, "pass", verdict="pass"))
    if settings.stream_canary_on and (due or striking == "stream_leak"):
        verdict = "fail" if striking == "stream_leak" else "pass"
        found.append(obs("canary_stream", verdict == "pass", verdict, verdict=verdict))
    return found


class WindowedMonitor(FakeMonitor):
    """Scripted probes whose window keeps `KEEP_S`, as the real monitor's does (a case stays fast)."""

    async def tick(self, now: float) -> list[Observation]:
        self.observations = [o for o in self.observations if o.at >= now - KEEP_S]
        return await super().tick(now)


@dataclass
class MatrixHost(FakeHost):
    """The fake host of a whole deployment: a run belongs to the server whose log it writes, a marker scan and a
    release see that server's runs only, and a launch beside a live run of the same server is recorded."""

    target: str = ""  # the server the fault hits
    kind: str = ""
    recurs: bool = False
    server_of: dict[int, str] = field(default_factory=dict)  # run pid -> server
    launches: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)

    def alive(self, server: str) -> list[FakeRun]:
        return [r for r in self.runs if self.server_of[r.pid] == server and r.exit_code is None]

    async def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        gpus: Sequence[int],
        run_id: str,
        marker: str,
        log_path: Path,
    ) -> RunHandle | SpawnFailed:
        server = log_path.stem
        if self.alive(server):
            self.violations.append(
                f"{server}: launched beside live run {[r.pid for r in self.alive(server)]}"
            )
        run = await super().spawn(argv, env, gpus, run_id, marker, log_path)
        assert isinstance(run, FakeRun)
        self.server_of[run.pid] = server
        self.launches[server] += 1
        return run

    async def earlier_run(self, marker: str, cfg: Any) -> list[str]:
        return [f"pid {r.pid}" for r in self.alive(cfg.name)]

    async def release(self, cfg: Any, sup: Any, **kw: Any) -> ReleaseReport:
        self.releases.append({**kw, "server": cfg.name})
        mine = cfg.name == self.target and not kw.get("any_run_of")  # the release of its own run, not a scan
        if self.release_misses and mine:  # says "released", kills nothing (a bug elsewhere)
            self.release_misses -= 1
            return ReleaseReport(True, "released", {"total": 0.01})
        for run in self.alive(cfg.name):
            if run.pid == kw.get("main_pid") or kw.get("any_run_of"):
                run.exit_code = -9
        return ReleaseReport(True, "released", {"total": 0.01})

    def monitor(self, spec: MonitorSpec) -> FakeMonitor:
        run = self.alive(spec.server)[-1]
        faulty = spec.server == self.target and (self.recurs or self.launches[spec.server] == 1)
        kind, ticks, router = (self.kind if faulty else ""), itertools.count(), spec.role == "router"

        def script(now: float) -> list[Observation]:
            return observe(kind, next(ticks), run, monitor.settings, router, now, bool(monitor.aborted_rids))

        monitor = WindowedMonitor(spec, script)
        self.monitors.append(monitor)
        return monitor


# ---- what the plan says a case ends in --------------------------------------------------------------------
def visible(s: Setting, kind: str) -> bool:
    """Whether the fault can be seen with this setting (by the probes that run, for this role)."""
    if s.role == "router":  # judged on its own liveness: its tree, its /health, its startup budget
        return kind in ("crash", "oom", "startup_failure", "startup_stalled", "health_unresponsive")
    if kind == "pause_overrun":  # a paused engine's other symptoms (a stall, /health failing) are not faults
        return True
    if kind == "pd_transfer_wedge":
        return s.role == "decode"
    if kind == "parser_misconfig":
        return s.canary_mode != "off"
    if kind == "stream_leak":
        return s.canary_mode != "off" and s.probes.get("stream_canary_period_s") != 0
    return True


def alert_only(s: Setting, kind: str) -> bool:
    """Whether the plan for the fault is to alert and keep serving (degraded)."""
    if kind in ("stream_leak", "pause_overrun", "brownout"):  # brownout_policy: alert by default
        return True
    policy_alert = s.policy.get("parser_policy") == "alert"
    family_unknown = s.model.startswith("/models/")  # no expected parsers: nothing to relaunch with
    return kind == "parser_misconfig" and (policy_alert or s.canary_mode == "advisory" or family_unknown)


def expected(s: Setting, kind: str, recurs: bool) -> tuple[set[ServerState], int, float]:
    """The end states the plan explains, and the least and most launches of the server the fault hits."""
    if not visible(s, kind):
        return {S.SERVING}, 1, 1
    if alert_only(s, kind):
        return {S.DEGRADED}, 1, 1
    if kind == "gpu_fault" or s.restarts == 0:
        return {S.FAILED}, 1, 1
    fixed_before_launch = not s.parsers and "expected_tool_parser" not in s.probes
    if kind == "parser_misconfig" and fixed_before_launch:  # the family's parsers fail too: reverted, failed
        return {S.FAILED}, 1, 1
    if not recurs:  # relaunched once, then serving (and relaunched once more to promote back a rung)
        return {S.SERVING}, 2, 3 if s.policy.get("promote_back") else 2
    if s.restart.get("slow_retry_s"):  # a spent budget is retried slowly: any step of that cycle
        retried = 2 if kind == "parser_misconfig" else s.restarts + 2  # reverted parsers wait for an operator
        return {S.FAILED, S.BACKOFF, S.STARTING, S.SERVING}, retried, math.inf
    return {S.FAILED}, 2, s.restarts + 1


# ---- one case ----------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """The state file and the journal are written as in production without waiting for the disk: durability is
    not what the matrix checks, and thousands of fsyncs would be most of its time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


async def run_case(
    tmp_path: Path, s: Setting, kind: str, recurs: bool, misses: int = 0
) -> tuple[Daemon, MatrixHost, dict[str, ServerState], Counter[str]]:
    """Run every server loop with the fault injected until nothing changes; stop. The states and the releases
    per server before the stop. `misses`: the target's first releases leave its run alive."""
    clock = FakeClock()
    target = "sim" if s.role == "unified" else s.role
    host = MatrixHost(target=target, kind=kind, recurs=recurs, release_misses=misses)
    d = Daemon(build(tmp_path, s), host=host, clock=clock)
    tasks = [asyncio.create_task(loop.run_forever()) for loop in d.loops]
    end, seen, changed = clock.t + SPAN_S, None, clock.t
    for _ in range(STEPS):
        now = ([loop.state for loop in d.loops], sorted(host.launches.items()))
        seen, changed = now, (changed if now == seen else clock.t)
        if clock.t >= min(end, changed + SETTLE_S) or any(t.done() for t in tasks):
            break
        await asyncio.sleep(0)
    else:
        raise AssertionError(
            f"fake time stuck at {clock.t - end + SPAN_S:.0f}s: a loop waits on something else"
        )
    states = {loop.name: loop.state for loop in d.loops}
    released = Counter(r["server"] for r in host.releases)
    for loop in reversed(d.loops):
        loop.stopping = True
        loop.commands.put_nowait(Command("stop", "test over", "test"))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    return d, host, states, released


def test_the_matrix_covers_every_documented_enum_value() -> None:
    """Every value of `canary_mode`, `parser_policy` and `role` is a setting of the matrix."""
    covered = {f"role={s.role}" for s in SETTINGS.values()}
    covered |= {f"{k}={v}" for s in SETTINGS.values() for k, v in (*s.probes.items(), *s.policy.items())}
    documented = {f"role={r.value}" for r in Role}
    for key, model in (("canary_mode", ProbesConfig), ("parser_policy", PolicyConfig)):
        found = model.model_fields[key]
        documented |= {f"{key}={v}" for v in get_args(found.annotation) if v != found.default}
    assert documented <= covered


def left_alive(host: MatrixHost) -> list[int]:
    return [r.pid for r in host.runs if r.exit_code is None]


@pytest.mark.parametrize(
    ("setting", "kind", "recurs"),
    [
        pytest.param(s, kind, recurs, id=f"{name}-{kind}-{'recurs' if recurs else 'once'}")
        for name, s in SETTINGS.items()
        for kind in KINDS
        for recurs in (False, True)
    ],
)
async def test_every_setting_keeps_one_tree_and_ends_where_its_plan_says(
    tmp_path: Path, setting: Setting, kind: str, recurs: bool
) -> None:
    """One tree per server, no internal error, the end its plan explains, nothing left after stop."""
    d, host, states, released = await run_case(tmp_path, setting, kind, recurs)
    journal = [(i.server, i.fault, i.action, i.severity) for i in d.svc.incidents.recent]
    assert not host.violations, host.violations
    assert not [e for e in journal if e[1] in ("internal_error", "launch_refused")], journal
    assert not left_alive(host) and all(loop.state is S.STOPPED for loop in d.loops), left_alive(host)
    ends, least, most = expected(setting, kind, recurs)
    target, reasons = host.target, {loop.name: loop.reason for loop in d.loops}
    assert states[target] in ends, (states, reasons, host.launches)
    assert least <= host.launches[target] <= most, (host.launches, reasons)
    if most == 1 and ends != {S.FAILED}:  # it served (or degraded) throughout: nothing was killed
        assert not released[target], host.releases
    if states[target] is S.FAILED:  # an operator is needed: paged
        assert (target, "page") in {(e[0], e[3]) for e in journal}, journal
    if states[target] is S.DEGRADED:  # alerted, not restarted
        assert (target, kind, "alert") in {e[:3] for e in journal}, journal
    assert all(state is S.SERVING for name, state in states.items() if name != target), (states, reasons)


@pytest.mark.parametrize("role", [r.value for r in Role])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_release_that_leaves_the_run_alive_never_costs_a_second_tree(
    tmp_path: Path, role: str, kind: str
) -> None:
    """A release that says "released" but kills nothing: the launch after it is refused and reaped, never doubled."""
    setting = Setting(role=role)
    d, host, states, _ = await run_case(tmp_path, setting, kind, recurs=False, misses=1)
    assert not host.violations and not left_alive(host), (host.violations, left_alive(host))
    ends, least, most = expected(setting, kind, recurs=False)
    launches = host.launches[host.target]
    assert states[host.target] in ends and least <= launches <= most, (states, host.launches)
    refused = [i.reason for i in d.svc.incidents.recent if i.fault == "launch_refused"]
    tree_alive = kind not in ("crash", "oom", "startup_failure")  # the fault left the tree running
    assert bool(refused) == (tree_alive and launches > 1), refused
