"""One supervised server: launch, watch, recover — the per-server control loop.

`transition` is the one function that changes a server's state; it checks the transition table, logs and
counts every change, and persists the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from policies.backoff import decide_restart, is_stable
from policies.flagcompat import FlagSet, check_ladders, express_argv, rejected
from policies.ladders import PastIncident, Rung, apply_rungs, ladder_key
from policies.parsers_table import ExpectedParsers
from policies.pd import Role
from policies.plan import PARSER_KEY, Plan, build_argv, parser_ladder, plan_recovery
from policies.states import FaultKind, ServerState, check_transition
from supervisor.config import ServerConfig
from supervisor.host import launcher, proctree
from supervisor.host.flaghelp import HelpUnavailable, target_flags
from supervisor.host.release import ReleaseReport, stop_and_release
from supervisor.loop.context import Context
from supervisor.loop.watch import Outcome, Watcher
from supervisor.records.incident import Incident

S = ServerState


@dataclass
class Command:
    """An operator action queued for a server."""

    kind: str  # "restart" | "pause" | "resume" | "stop"
    reason: str = ""
    actor: str = "operator"
    done: asyncio.Future[str] | None = field(default=None, repr=False)


class ServerRuntime:
    """The control loop and status of one server."""

    def __init__(self, cfg: ServerConfig, ctx: Context) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.name = cfg.name
        # the server marker names this deployment too (its state dir), so two daemons on one host
        # (or a test and a benchmark) never reap each other's servers of the same name
        state_dir = str(Path(ctx.config.supervisor.state_dir).resolve())
        self.marker = f"{cfg.name}@{hashlib.sha1(state_dir.encode()).hexdigest()[:10]}"
        self.log = structlog.get_logger().bind(server=cfg.name)
        self.state = S.STOPPED
        self.since = time.time()
        self.reason = "not started"
        self.record = ctx.statefile.record(cfg.name)
        self.launched: launcher.Launched | None = None
        self.run_id = ""
        self.argv: tuple[str, ...] = cfg.argv
        self.restarts: list[float] = []
        self.restart_count = 0
        self.launch_count = 0
        self.serving_since: float | None = None
        self.started_at = 0.0
        self.open_incident: Incident | None = None
        self.paused = False
        self.state_before_pause = S.STOPPED
        self.commands: asyncio.Queue[Command] = asyncio.Queue()
        self.stopping = False
        self.watcher = Watcher(self)
        self.flags: FlagSet | None = None
        self.skipped_rungs: list[str] = []
        self.rng = random.Random()

    # ---- state -------------------------------------------------------------------------------------------
    def transition(self, new: ServerState, reason: str) -> None:
        """Change state (the only place that does): check, log, count, persist, tell the daemon."""
        if new == self.state:
            self.reason = reason
            return
        problem = check_transition(self.state, new)
        if problem:
            self.log.error("state.illegal_transition", old=self.state.value, new=new.value, problem=problem)
            return
        self.log.info("state.transition", old=self.state.value, new=new.value, reason=reason)
        self.state, self.since, self.reason = new, time.time(), reason
        self.ctx.metrics.set_state(self.name, new.value)
        self.record.state = new.value
        self.ctx.save_state()
        self.ctx.on_state_change()

    @property
    def ladders(self) -> dict[str, Any]:
        """This server's ladders plus the parser fix, less the rungs the installed SGLang cannot express."""
        ladders: dict[str, Any] = dict(self.cfg.ladders)
        expected = self.cfg.expected_parsers()
        if expected is not None:
            ladders[PARSER_KEY] = parser_ladder(ExpectedParsers(*expected))
        if self.flags is None:
            return ladders
        return {key: tuple(r for r in rungs if self._expressible(r)) for key, rungs in ladders.items()}

    def _expressible(self, rung: Rung) -> bool:
        assert self.flags is not None
        args, _ = apply_rungs((), [rung])
        return express_argv(args, self.flags).argv is not None

    def current_argv(self) -> tuple[str, ...]:
        """The launch argv: configured command and args, active ladder levels applied, renamed flags mapped."""
        args, _ = build_argv(self.cfg.args, self.record.levels, self.ladders)
        if self.flags is not None:
            expressed = express_argv(args, self.flags)
            args = expressed.argv if expressed.argv is not None else args
        return (*self.cfg.command, *args)

    async def learn_flags(self) -> None:
        """The installed SGLang's own `--help` (cached per interpreter and version) decides which flags exist."""
        if self.cfg.role is Role.ROUTER:
            return
        cache = Path(self.ctx.config.supervisor.state_dir) / "flagcache"
        result = await asyncio.to_thread(target_flags, list(self.cfg.command), cache)
        if isinstance(result, HelpUnavailable):
            self.log.warning("flags.unknown", reason=result.reason)
            return
        self.flags = result
        self.skipped_rungs = check_ladders(self.cfg.ladders, result)
        for note in self.skipped_rungs:
            self.log.warning("ladder.rung_skipped", note=f"{note}: this rung is skipped, never launched")
        bad = rejected(self.cfg.args, result)
        if bad:
            self.log.error(
                "flags.rejected", flags=bad, hint="the target rejects these launch flags: fix args"
            )

    @property
    def rung(self) -> int:
        """The highest active ladder level (0 = the configured flags)."""
        return max(self.record.levels.values(), default=0)

    # ---- main loop ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Reap what a previous daemon left, learn the target's flags, then launch and supervise until stopped."""
        await self.reap_previous()
        await self.learn_flags()
        while not self.stopping:
            if self.paused:
                await self._wait_resume_or_restart()
                continue
            outcome = await self.launch_and_watch()
            if self.stopping:
                break
            if outcome.command is not None:
                await self.planned_restart(outcome.command)
                continue
            if outcome.fault_kind:
                await self.recover(outcome)
        await self.stop_for_good()

    async def reap_previous(self) -> None:
        """Processes of an earlier run of this server (found by marker) are reaped before anything launches.

        We reap rather than adopt: the old tree's stdout was a pipe to the dead daemon, its launch was not
        watched, and its flags may predate the current config — relaunching costs a load but is certain.
        """
        found = proctree.find_marked(server=self.marker)
        if not found and not self.record.pid:
            return
        self.log.warning("recovery.reap_previous", pids=[p.pid for p in found], run_id=self.record.run_id)
        report = await stop_and_release(
            self.cfg,
            self.ctx.config.supervisor,
            self.ctx.gpu_backend,
            main_pid=None,
            pgid=None,
            run_id=self.record.run_id or "",
            mode="kill",
            known=[],
            any_run_of=self.marker,
        )
        if not report.ok:
            self.transition(S.FAILED, f"could not reap the previous run: {report.reason}")
            self.paused = False
            await self._wait_resume_or_restart()

    async def launch(self) -> bool:
        """Start the server in a new session with a fresh run id; False (and an incident) if it cannot start."""
        self.run_id = uuid.uuid4().hex[:12]
        self.argv = self.current_argv()
        log_path = Path(self.ctx.config.supervisor.log_dir) / f"{self.name}.log"
        result = await asyncio.to_thread(
            launcher.spawn,
            list(self.argv),
            dict(self.cfg.env),
            list(self.cfg.gpus),
            self.run_id,
            self.marker,
            log_path,
        )
        if isinstance(result, launcher.SpawnFailed):
            self.log.error("server.spawn_failed", reason=result.reason)
            return False
        self.launched = result
        self.launch_count += 1
        self.started_at = time.monotonic()
        self.record.run_id, self.record.pid, self.record.pgid = self.run_id, result.pid, result.pgid
        self.record.argv = list(self.argv)
        self.log.info("server.started", pid=result.pid, run_id=self.run_id, argv=list(self.argv))
        return True

    async def launch_and_watch(self) -> Outcome:
        """Launch, then watch through startup and serving until a fault or a command."""
        self.transition(S.STARTING, "launching")
        if not await self.launch():
            return Outcome(
                fault_kind=FaultKind.STARTUP_FAILURE.value, reason="the launch command could not start"
            )
        return await self.watcher.watch()

    # ---- recovery ----------------------------------------------------------------------------------------
    def _tags(self, outcome: Outcome) -> list[str]:
        tags = [str(t) for t in outcome.evidence.get("tags", []) if isinstance(t, str)]
        if any(a.startswith("--speculative-algorithm") for a in self.argv):
            tags.append("spec_decode")
        if "illegal memory access" in str(outcome.evidence).lower():
            tags.append("illegal_memory_access")
        return tags

    def plan(self, outcome: Outcome, now: float) -> Plan:
        """Ask the policies what to do about this fault."""
        kind = FaultKind(outcome.fault_kind)
        if is_stable(self.serving_since, now, self.ctx.config.supervisor.restart):
            self.restarts.clear()
        restart = decide_restart(self.restarts, now, self.ctx.config.supervisor.restart, self.rng.random())
        ladders = self.ladders
        key: str | None
        if self.cfg.role is Role.ROUTER:
            key = None  # SGLang's fallback flags do not apply to the router
        elif kind is FaultKind.PARSER_MISCONFIG:
            key = PARSER_KEY
        else:
            key = ladder_key(kind, self._tags(outcome), ladders)
        history = [PastIncident(str(h[0]), int(h[1])) for h in self.record.history]
        return plan_recovery(
            kind.value, key, history, self.record.levels, ladders, restart, self.cfg.policy.parser_policy
        )

    async def recover(self, outcome: Outcome) -> None:
        """Incident, forensics, kill, release, verify, then backoff and relaunch — or failed."""
        now = time.monotonic()
        plan = self.plan(outcome, now)
        incident = self.ctx.new_incident(self, outcome, plan)
        if plan.action == "alert":
            return
        self.transition(S.RECOVERING, f"{outcome.fault_kind}: {outcome.reason}")
        forensics = await self.ctx.capture_forensics(self, incident)
        report = await self.release(mode="kill")
        self.ctx.metrics.observe_gpu_release(self.name, report.steps.get("total", 0.0))
        self.ctx.metrics.restart(self.name, outcome.fault_kind)
        if plan.ladder_key is not None:
            self.record.history.append([plan.ladder_key, plan.rung])
        self.record.levels = dict(plan.levels)
        flag_notes = [n for n in self.skipped_rungs if plan.ladder_key and f".{plan.ladder_key}[" in n]
        self.ctx.metrics.set_rung(self.name, self.rung)
        new_argv = self.current_argv()
        _, diff = build_argv(self.cfg.args, self.record.levels, self.ladders)
        incident = replace(
            incident,
            forensics_path=forensics,
            argv_after=new_argv,
            flags_added=tuple(line[1:] for line in diff.lines() if line.startswith(("+", "~"))),
            flags_removed=tuple(line[1:] for line in diff.lines() if line.startswith("-")),
            evidence={**incident.evidence, "release": report.to_json(), "flag_notes": flag_notes},
        )
        self.ctx.update_incident(self, incident)
        if not report.ok:
            self.transition(S.FAILED, f"release failed: {report.reason}")
            self.ctx.page(incident, f"release failed: {report.reason}")
            await self._wait_resume_or_restart()
            return
        if plan.action == "fail":
            self.transition(S.FAILED, plan.reason)
            self.ctx.page(incident, plan.reason)
            if plan.slow_retry and plan.delay_s > 0:
                await self._sleep_interruptible(plan.delay_s)
            else:
                await self._wait_resume_or_restart()
            return
        self.restarts.append(now)
        self.restart_count += 1
        self.transition(S.BACKOFF, f"relaunch in {plan.delay_s:.1f}s: {plan.reason}")
        await self._sleep_interruptible(plan.delay_s)

    async def release(self, mode: str) -> ReleaseReport:
        """Stop this run and release everything it held."""
        launched = self.launched
        known = list(self.watcher.known_descendants())
        report = await stop_and_release(
            self.cfg,
            self.ctx.config.supervisor,
            self.ctx.gpu_backend,
            main_pid=launched.pid if launched else None,
            pgid=launched.pgid if launched else None,
            run_id=self.run_id,
            mode=mode,
            known=known,
        )
        self.log.info("recovery.release", **report.to_json())
        if launched is not None:
            await asyncio.to_thread(launched.close)
        self.launched = None
        self.record.pid = self.record.pgid = None
        self.ctx.save_state()
        return report

    def promotion_due(self, now: float, quiet: bool) -> Command | None:
        """Promote-back (off by default): after a stable period, at a quiet moment, try one rung lower."""
        policy = self.cfg.policy
        if not policy.promote_back or not quiet or self.serving_since is None or self.rung == 0:
            return None
        if now - self.serving_since < policy.promote_after_s:
            return None
        key = max(self.record.levels, key=lambda k: self.record.levels[k])
        return Command(
            "promote",
            f"stable for {policy.promote_after_s:g}s: try {key} rung {self.record.levels[key] - 1}",
            "supervisor",
        )

    def promote(self) -> None:
        """Lower the highest ladder one rung; recorded in the history so a returning fault steps back up at once."""
        key = max(self.record.levels, key=lambda k: self.record.levels[k])
        level = self.record.levels[key] - 1
        self.record.history.append([key, level])
        if level:
            self.record.levels[key] = level
        else:
            del self.record.levels[key]
        self.ctx.metrics.set_rung(self.name, self.rung)
        self.ctx.save_state()

    async def planned_restart(self, cmd: Command) -> None:
        """An operator restart (or a promotion): an incident with who and why, drain, release, relaunch at once."""
        if cmd.kind == "promote":
            self.promote()
        self.ctx.operator_incident(self, cmd.kind, cmd)
        self.transition(S.STOPPING, f"restart requested by {cmd.actor}: {cmd.reason}")
        report = await self.release(mode="drain")
        if cmd.done is not None and not cmd.done.done():
            cmd.done.set_result("restarted" if report.ok else f"release failed: {report.reason}")
        if not report.ok:
            self.transition(S.FAILED, f"release failed: {report.reason}")
            await self._wait_resume_or_restart()
            return
        self.transition(S.STOPPED, f"stopped for a {cmd.kind}; relaunching")

    async def stop_for_good(self) -> None:
        """Daemon shutdown: drain and release, then stopped."""
        if self.launched is not None or self.state not in (S.STOPPED, S.FAILED):
            with contextlib.suppress(Exception):
                self.transition(S.STOPPING, "daemon stopping")
            report = await self.release(mode="drain")
            self.transition(S.STOPPED if report.ok else S.FAILED, report.reason)
        await self.watcher.aclose()

    # ---- waiting -------------------------------------------------------------------------------------------
    async def _sleep_interruptible(self, seconds: float) -> None:
        """Backoff: sleep, but act on commands (stop, pause, restart now) meanwhile."""
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            try:
                cmd = await asyncio.wait_for(
                    self.commands.get(), timeout=min(0.5, max(0.01, deadline - time.monotonic()))
                )
            except TimeoutError:
                continue
            if self.handle_command(cmd) == "restart":
                return

    async def _wait_resume_or_restart(self) -> None:
        """Failed: wait for an operator (restart or resume) or shutdown."""
        while not self.stopping:
            try:
                cmd = await asyncio.wait_for(self.commands.get(), timeout=0.5)
            except TimeoutError:
                continue
            if self.handle_command(cmd) in ("restart", "resume"):
                self.restarts.clear()
                return

    def handle_command(self, cmd: Command) -> str:
        """Apply pause/resume/stop at once; return the command kind for the caller's loop."""
        if cmd.kind == "pause" and not self.paused:
            self.paused = True
            self.state_before_pause = self.state
            self.ctx.operator_incident(self, "pause", cmd)
            self.transition(S.PAUSED, f"paused by {cmd.actor}: {cmd.reason}")
        elif cmd.kind == "resume" and self.paused:
            self.paused = False
            self.ctx.operator_incident(self, "resume", cmd)
            if self.launched is not None:
                back = (
                    self.state_before_pause
                    if self.state_before_pause in (S.STARTING, S.DEGRADED)
                    else S.SERVING
                )
                if back is S.SERVING and self.serving_since is None:
                    back = S.STARTING
                self.transition(back, f"resumed by {cmd.actor}: {cmd.reason}")
        elif cmd.kind == "stop":
            self.stopping = True
        if cmd.done is not None and not cmd.done.done() and cmd.kind != "restart":
            cmd.done.set_result(cmd.kind)
        if cmd.kind == "restart" and cmd.done is not None and not cmd.done.done():
            cmd.done.set_result("restarting")
        return cmd.kind

    # ---- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """This server in `/status`."""
        launched = self.launched
        last = self.ctx.last_incident(self.name)
        return {
            "name": self.name,
            "role": self.cfg.role.value,
            "state": self.state.value,
            "since": self.since,
            "reason": self.reason,
            "pid": launched.pid if launched else None,
            "run_id": self.run_id or None,
            "argv": list(self.argv),
            "gpus": list(self.cfg.gpus),
            "restarts": self.restart_count,
            "fallback": {
                "rung": self.rung,
                "levels": dict(self.record.levels),
                "reason": last.reason if last else "",
                "flags": [a for a in self.argv if a not in self.cfg.argv],
            },
            "probes": self.watcher.snapshot(),
            "startup": self.watcher.startup_view(),
            "last_incident": last.to_json() if last else None,
        }
