"""One supervised server: its state, its run, its commands — the control loop (observe → triage → act).

`transition` is the one method that changes a server's state; it checks the transition table, logs and counts
every change, and persists the record. Watching a launch is `supervisor.loop.watch`, recovering from a fault
`supervisor.loop.recovery`; every effect goes through the injected `Host`, every duration through the `Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import uuid
from pathlib import Path
from typing import Any

import structlog

from policies.argv import redact as redact_argv
from policies.flagcompat import FlagSet, check_ladders, express_argv, rejected
from policies.ladders import Rung, apply_rungs
from policies.parsers_table import ExpectedParsers
from policies.pd import Role, restart_order
from policies.plan import PARSER_KEY, build_argv, parser_ladder
from policies.states import ServerState, check_transition, resume_target
from supervisor.config import ServerConfig
from supervisor.host.flaghelp import HelpUnavailable
from supervisor.host.launcher import SpawnFailed
from supervisor.loop import recovery
from supervisor.loop.commands import Command, Outcome
from supervisor.loop.grouped import run_grouped
from supervisor.loop.host import RunHandle
from supervisor.loop.services import Services
from supervisor.loop.watch import Watch
from supervisor.records.incident import Incident

S = ServerState
WAIT_POLL_S = 0.5


class ServerLoop:
    """The control loop and status of one server."""

    def __init__(self, cfg: ServerConfig, svc: Services) -> None:
        self.cfg = cfg
        self.svc = svc
        self.clock = svc.clock
        self.name = cfg.name
        # the server marker names this deployment too (its state dir), so two daemons on one host
        # (or a test and a benchmark) never reap each other's servers of the same name
        state_dir = str(Path(svc.config.supervisor.state_dir).resolve())
        self.marker = f"{cfg.name}@{hashlib.sha1(state_dir.encode()).hexdigest()[:10]}"
        self.log = structlog.get_logger().bind(server=cfg.name)
        self.state = S.STOPPED
        self.since = self.clock.wall()
        self.reason = "not started"
        self.record = svc.statefile.record(cfg.name)
        self.run: RunHandle | None = None
        self.run_id = ""
        self.argv: tuple[str, ...] = cfg.argv
        self.port = cfg.http_port
        self.restarts: list[float] = []
        self.restart_count = 0
        self.launch_count = 0
        self.started_at = 0.0  # monotonic, this launch
        self.serving_since: float | None = None  # monotonic
        self.open_incident: Incident | None = None
        self.detected_mono: float | None = None  # when the open incident was detected (monotonic)
        self.unproven = ""  # serving without a passing canary: why
        self.paused = False
        self.state_before_pause = S.STOPPED
        self.commands: asyncio.Queue[Command] = asyncio.Queue()
        self.stopping = False
        self.flags: FlagSet | None = None
        self.skipped_rungs: list[str] = []
        self.rng = random.Random()
        self.last_beat = self.clock.monotonic()
        self.busy_until = 0.0  # inside a bounded step (forensics, release) until then: not stale
        self.watch = Watch(self)

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
        self.state, self.since, self.reason = new, self.clock.wall(), reason
        self.svc.metrics.set_state(self.name, new.value)
        self.record.state = new.value
        self.svc.save_state()
        self.svc.on_state_change()

    def beat(self) -> None:
        """The loop is alive (systemd's watchdog and /healthz read this)."""
        self.last_beat = self.clock.monotonic()

    def busy(self, seconds: float) -> None:
        """Entering a step bounded by `seconds`: the loop is not stale while it runs."""
        self.busy_until = self.clock.monotonic() + seconds

    def stale(self, now: float, after_s: float) -> bool:
        """No beat for `after_s` and not inside a bounded step: the loop is wedged."""
        return now - self.last_beat > after_s and now > self.busy_until

    def reconfigure(self, cfg: ServerConfig) -> None:
        """A reloaded config: probe settings apply now; argv and port at the next launch."""
        self.cfg = cfg
        self.watch.reconfigure()

    # ---- argv and ladders ----------------------------------------------------------------------------------
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

    @property
    def rung(self) -> int:
        """The highest active ladder level (0 = the configured flags)."""
        return max(self.record.levels.values(), default=0)

    async def learn_flags(self) -> None:
        """The installed SGLang's own `--help` (cached per interpreter and version) decides which flags exist."""
        if self.cfg.role is Role.ROUTER:
            return
        cache = Path(self.svc.config.supervisor.state_dir) / "flagcache"
        result = await self.svc.host.learn_flags(self.cfg.command, cache)
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

    # ---- main loop -----------------------------------------------------------------------------------------
    async def run_forever(self) -> None:
        """Reap what a previous daemon left, learn the target's flags, then launch and supervise until stopped."""
        group = self.svc.config.group
        if self.svc.group is not None and group is not None and group.server == self.name:
            await run_grouped(self, self.svc.group)  # the group decides every stop and launch
            return
        self.adopt_interrupted()
        await recovery.reap_previous(self)
        await self.learn_flags()
        while not self.stopping:
            try:
                await self.step()
            except Exception as exc:  # a bug or a host error in one step must not end supervision
                await self.step_failed(exc)
        await recovery.stop_for_good(self)

    async def step(self) -> None:
        """One round: wait while paused, or launch and watch, then act on why watching ended."""
        if self.paused:
            await self.wait_for_operator()
            return
        outcome = await self.launch_and_watch()
        if self.stopping:
            return
        if outcome.command is not None:
            await recovery.planned_restart(self, outcome.command)
        elif outcome.fault is not None:
            await recovery.recover(self, outcome.fault)

    async def step_failed(self, exc: Exception) -> None:
        """An unexpected error in a step: kill what runs (never two trees), page, wait for an operator."""
        self.log.exception("server.step_failed", error=repr(exc))
        with contextlib.suppress(Exception):
            await recovery.release_run(self, mode="kill")
        self.transition(S.FAILED, f"internal error: {exc!r}; operator needed (see the daemon log)")
        self.svc.incidents.notice(
            self.name,
            self.clock.wall(),
            "internal_error",
            "failed",
            f"internal error: {exc!r}",
            {"error": repr(exc)},
            self.argv,
            self.rung,
            severity="page",
        )
        await self.wait_for_operator()

    async def launch(self) -> SpawnFailed | None:
        """Start the server in a new session with a fresh run id; the failure when it cannot start."""
        self.run_id = uuid.uuid4().hex[:12]
        self.argv = self.current_argv()
        self.port = self.cfg.http_port
        log_path = Path(self.svc.config.supervisor.log_dir) / f"{self.name}.log"
        result = await self.svc.host.spawn(
            self.argv, dict(self.cfg.env), self.cfg.gpus, self.run_id, self.marker, log_path
        )
        if isinstance(result, SpawnFailed):
            self.log.error("server.spawn_failed", reason=result.reason)
            return result
        self.run = result
        self.launch_count += 1
        self.started_at = self.clock.monotonic()
        self.record.run_id, self.record.pid, self.record.pgid = self.run_id, result.pid, result.pgid
        self.record.argv = redact_argv(list(self.argv))
        self.log.info("server.started", pid=result.pid, run_id=self.run_id, argv=redact_argv(list(self.argv)))
        return None

    async def launch_and_watch(self) -> Outcome:
        """Launch, then watch through startup and serving until a fault or a command."""
        self.transition(S.STARTING, "launching")
        held = await self.svc.host.foreign_port_holders(self.cfg)
        if held:
            return recovery.spawn_failure(
                self, SpawnFailed(f"a port is held by a process that is not ours: {'; '.join(held)}")
            )
        failed = await self.launch()
        if failed is not None:
            return recovery.spawn_failure(self, failed)
        return await self.watch.run()

    def adopt_interrupted(self) -> None:
        """A recovery a dead daemon left unfinished: journaled as interrupted, completed by this daemon's launch."""
        if not self.record.open_incident:
            return
        incident = self.svc.incidents.interrupted(self.record.open_incident, self.clock.wall())
        if incident is not None:
            age = max(0.0, self.clock.wall() - incident.detected_at)
            self.open_incident, self.detected_mono = incident, self.clock.monotonic() - age
        self.record.open_incident = ""

    def became_serving(self, unproven: str) -> None:
        """Startup proven (or serving unproven): serving; resolve the open incident; PD follow-ups."""
        now = self.clock.monotonic()
        self.serving_since = now
        self.set_unproven(unproven)
        self.transition(S.SERVING, unproven or "health 200 and canary passed")
        self.svc.metrics.observe_startup(self.name, now - self.started_at)
        incident = self.open_incident
        if incident is not None:
            since = self.detected_mono if self.detected_mono is not None else self.started_at
            self.svc.metrics.observe_time_to_serving(self.name, now - since)
            self.svc.incidents.resolve(incident, self.clock.wall(), now - since)
            self.open_incident, self.detected_mono = None, None
            self.record.open_incident = ""
            self.svc.save_state()
        if self.cfg.role is Role.PREFILL and self.launch_count > 1:
            self.restart_followers()

    def set_unproven(self, why: str) -> None:
        """Serving without a passing canary (a warning), or proven again when `why` is empty."""
        if why and not self.unproven:
            self.svc.incidents.notice(
                self.name,
                self.clock.wall(),
                "canary_unproven",
                "alert",
                why,
                {"probes": self.watch.snapshot()},
                self.argv,
                self.rung,
            )
        elif self.unproven and not why and self.state is S.SERVING:
            self.transition(S.SERVING, "canary passed")
        self.unproven = why
        self.svc.metrics.set_unproven(self.name, bool(why))

    def restart_followers(self) -> None:
        """SGLang decode caches prefill endpoints: a relaunched prefill is followed by its decodes."""
        roles = {name: loop.cfg.role for name, loop in self.svc.loops.items()}
        for name in restart_order(self.name, roles)[1:]:
            other = self.svc.loops[name]
            if other.state in (S.SERVING, S.DEGRADED, S.STARTING):
                other.commands.put_nowait(
                    Command("restart", f"prefill {self.name} was restarted", actor="supervisor")
                )
                self.log.info("pd.restart_decode", decode=name, prefill=self.name)

    # ---- commands and waiting ------------------------------------------------------------------------------
    def handle_command(self, cmd: Command) -> str:
        """Apply pause/resume/stop at once; return the command kind for the caller's loop."""
        if cmd.kind == "pause" and not self.paused:
            self.paused = True
            self.state_before_pause = self.state
            self.operator_entry("pause", cmd)
            self.transition(S.PAUSED, f"paused by {cmd.actor}: {cmd.reason}")
        elif cmd.kind == "resume" and self.paused:
            self.paused = False
            self.operator_entry("resume", cmd)
            back = resume_target(
                self.state_before_pause, self.run is not None, self.serving_since is not None
            )
            if back is not None:
                self.transition(back, f"resumed by {cmd.actor}: {cmd.reason}")
        elif cmd.kind == "stop":
            self.stopping = True
        cmd.answer("restarting" if cmd.kind == "restart" else cmd.kind)
        return cmd.kind

    def operator_entry(self, action: str, cmd: Command) -> None:
        """A control action in the journal, with who and why."""
        self.svc.incidents.operator(
            self.name, self.clock.wall(), action, cmd.reason, cmd.actor, self.argv, self.rung
        )

    def next_command(self) -> Command | None:
        """A queued command, without waiting."""
        try:
            return self.commands.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def sleep_interruptible(self, seconds: float) -> None:
        """Backoff: sleep, but act on commands (stop, pause, restart now) meanwhile."""
        deadline = self.clock.monotonic() + seconds
        while not self.stopping and self.clock.monotonic() < deadline:
            self.beat()
            cmd = self.next_command()
            if cmd is None:
                await self.clock.sleep(min(WAIT_POLL_S, max(0.0, deadline - self.clock.monotonic())))
            elif self.handle_command(cmd) == "restart":
                return

    async def wait_for_operator(self) -> None:
        """Failed or paused: wait for an operator (restart or resume) or shutdown."""
        while not self.stopping:
            self.beat()
            cmd = self.next_command()
            if cmd is None:
                await self.clock.sleep(WAIT_POLL_S)
            elif self.handle_command(cmd) in ("restart", "resume"):
                self.restarts.clear()
                return

    # ---- status --------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """This server in `/status` (secrets redacted)."""
        last = self.svc.incidents.last(self.name)
        argv = redact_argv(list(self.argv))
        configured = set(redact_argv(list(self.cfg.argv)))
        return {
            "name": self.name,
            "role": self.cfg.role.value,
            "state": self.state.value,
            "since": self.since,
            "reason": self.reason,
            "unproven": self.unproven or None,
            "pid": self.run.pid if self.run else None,
            "run_id": self.run_id or None,
            "argv": argv,
            "gpus": list(self.cfg.gpus),
            "restarts": self.restart_count,
            "fallback": {
                "rung": self.rung,
                "levels": dict(self.record.levels),
                "reason": last.reason if last else "",
                "flags": [a for a in argv if a not in configured],
            },
            "probes": self.watch.snapshot(),
            "startup": self.watch.startup_view(),
            "last_incident": last.to_json() if last else None,
        }
