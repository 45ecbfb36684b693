"""One supervised server: the control loop (observe → triage → decide → act) composing watch, recovery, group.

The server's state (lifecycle state, run, incident, rungs, restarts) belongs to its `ServerOwner`; this loop
holds only the loop's own mechanics (commands, the beat, the target's flags). Watching a launch is
`supervisor.loop.watch`, recovering from a fault `supervisor.loop.recovery`; a fault's step is decided once, by
`decide` (policies), and carried out without deciding again. Every effect goes through the injected `Host`,
every duration through the `Clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from policies.argv import redact as redact_argv
from policies.decide import Next, next_step
from policies.flagcompat import FlagSet, check_ladders, express_argv, rejected
from policies.ladders import PastIncident, Rung, apply_rungs
from policies.model import Fault, Observation
from policies.parsers_table import ExpectedParsers
from policies.pd import Role
from policies.plan import PARSER_KEY, Plan, build_argv, parser_ladder
from policies.spec import spec_hash
from policies.states import ServerState, resume_target
from policies.triage import AWAITING, PlanFacts, plan
from supervisor.config import ServerConfig
from supervisor.host import proctree
from supervisor.host.flaghelp import HelpUnavailable
from supervisor.host.launcher import SpawnFailed
from supervisor.loop import adoption, first_launch, pd_peers, recovery
from supervisor.loop.commands import Command, Outcome
from supervisor.loop.grouped import run_grouped
from supervisor.loop.owner import ServerOwner
from supervisor.loop.services import Services
from supervisor.loop.status_view import engine_pause, server_status
from supervisor.loop.watch import Watch
from supervisor.packaged import version
from supervisor.reporting.metrics import ServerGauges
from supervisor.rungs import apply_rung

S = ServerState
WAIT_POLL_S = 0.5


class ServerLoop:
    """The control loop of one server."""

    def __init__(self, cfg: ServerConfig, svc: Services) -> None:
        self.cfg = cfg
        self.svc = svc
        self.clock = svc.clock
        self.name = cfg.name
        self.marker = proctree.server_marker(cfg.name, svc.config.supervisor.state_dir)
        self.log = structlog.get_logger().bind(server=cfg.name)
        self.owner = ServerOwner(
            cfg.name,
            svc.statefile.record(cfg.name),
            svc.clock,
            svc.save_state,
            lambda: (
                svc.on_state_change()
            ),  # read at each change: the daemon may set it after this loop exists
            self.log,
        )
        self.commands: asyncio.Queue[Command] = asyncio.Queue()
        self.stopping = False
        self.detaching = False  # a handover: stop supervising but leave the run to the next daemon
        self.flags: FlagSet | None = None
        self.skipped_rungs: list[str] = []
        self.rng = random.Random()
        self.last_beat = self.clock.monotonic()
        self.busy_until = 0.0  # inside a bounded step (forensics, release) until then: not stale
        self.owner.set_argv(cfg.argv)
        self.planner: Callable[[Fault], Plan] = (
            self._plan
        )  # a group member plans with the group's streak and levels instead
        self._watch = Watch(self)

    # ---- what others read ----------------------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        return self.owner.state

    @property
    def reason(self) -> str:
        return self.owner.reason

    @property
    def unproven(self) -> str:
        return self.owner.unproven

    @property
    def rung(self) -> int:
        return self.owner.rung

    @property
    def watch(self) -> Watch:
        return self._watch

    def latest_progress(self) -> Observation | None:
        """The newest progress observation while serving (a decode's view of its prefill)."""
        return self._watch.latest("progress") if self.owner.state is S.SERVING else None

    def latest_health(self) -> Observation | None:
        """The newest `/health` observation of this launch (a PD partner's view of it)."""
        return self._watch.latest("health")

    def enqueue(self, cmd: Command) -> None:
        """Queue a command for this loop."""
        self.commands.put_nowait(cmd)

    # ---- the beat ------------------------------------------------------------------------------------------
    def beat(self) -> None:
        """The loop is alive (systemd's watchdog and /healthz read this)."""
        self.last_beat = self.clock.monotonic()

    def busy(self, seconds: float) -> None:
        """Entering a step bounded by `seconds` (0: the step ended): the loop is not stale while it runs."""
        self.busy_until = self.clock.monotonic() + seconds if seconds else 0.0

    def stale(self, now: float, after_s: float) -> bool:
        """No beat for `after_s` and not inside a bounded step: the loop is wedged."""
        return now - self.last_beat > after_s and now > self.busy_until

    def reconfigure(self, cfg: ServerConfig) -> None:
        """A reloaded config: probe settings apply now; argv and port at the next launch."""
        self.cfg = cfg
        self._watch.reconfigure()

    # ---- argv, ladders, decisions --------------------------------------------------------------------------
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
        args, _ = build_argv(self.cfg.args, self.owner.levels, self.ladders)
        if self.flags is not None:
            expressed = express_argv(args, self.flags)
            args = expressed.argv if expressed.argv is not None else args
        return (*self.cfg.command, *args)

    def plan_facts(self) -> PlanFacts:
        """What the policies need of this server to plan a recovery."""
        owner, policy = self.owner, self.cfg.policy
        return PlanFacts(
            role=self.cfg.role.value,
            args=owner.argv[len(self.cfg.command) :],
            restarts=owner.streak,
            serving_since=owner.serving_since,
            restart=self.svc.config.supervisor.restart,
            jitter=self.rng.random(),
            history=tuple(PastIncident(k, r) for k, r in owner.history),
            levels=owner.levels,
            ladders=self.ladders,
            parser_policy=policy.parser_policy,
            canary_mode=self.cfg.probes.canary_mode,
            brownout_policy=policy.brownout_policy,
        )

    def _plan(self, fault: Fault) -> Plan:
        decided = plan(fault, self.plan_facts(), self.clock.monotonic())
        if decided.streak_over:
            self.owner.end_streak()
        return decided.plan

    def plan_with(self, planner: Callable[[Fault], Plan]) -> None:
        """Plan this server's faults with `planner` (a group member: the group's streak and levels)."""
        self.planner = planner

    def decide(self, fault: Fault) -> Next:
        """The one decision about a fault: its plan (policies.triage.plan) and the step (policies.decide)."""
        return next_step(self.owner.paused, self.planner(fault))

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
        first_launch.adopt_interrupted(self)
        await self.learn_flags()
        if not await adoption.adopt_previous(self, version()):
            first_launch.fix_parsers(self)
        while not self.stopping:
            try:
                await self.step()
            except Exception as exc:  # a bug or a host error in one step must not end supervision
                await self.step_failed(exc)
        if self.detaching:
            await adoption.detach(self)  # a handover: the next daemon adopts the run
        else:
            await recovery.stop_for_good(self)

    async def step(self) -> None:
        """One round: wait while paused, or launch and watch, then act on why watching ended."""
        if self.owner.paused:
            await self.wait_for_operator()
            return
        adopted = self.owner.run is not None and self.owner.state is S.STARTING
        outcome = await (self._watch.run() if adopted else self.launch_and_watch())
        if self.stopping:
            return
        if outcome.command is not None:
            await recovery.planned_restart(self, outcome.command)
        elif outcome.fault is not None and outcome.decided is not None:
            await recovery.recover(self, outcome.fault, outcome.decided)

    async def step_failed(self, exc: Exception) -> None:
        """An unexpected error in a step: kill what runs (never two trees), page, wait for an operator."""
        self.log.exception("server.step_failed", error=repr(exc))
        with contextlib.suppress(Exception):
            await recovery.release_run(self, mode="kill", any_run_of=self.marker)
        self.owner.transition(S.FAILED, f"internal error: {exc!r}; operator needed (see the daemon log)")
        self.svc.incidents.notice(
            self.name,
            self.clock.wall(),
            "internal_error",
            "failed",
            f"internal error: {exc!r}",
            {"error": repr(exc)},
            self.owner.argv,
            self.owner.rung,
            severity="page",
        )
        await self.wait_for_operator()

    async def launch(self) -> SpawnFailed | None:
        """Start the server in a new session with a fresh run id; the failure when it cannot start."""
        run_id = uuid.uuid4().hex[:12]
        argv = self.current_argv()
        self.owner.set_argv(argv)
        log_path = Path(self.svc.config.supervisor.log_dir) / f"{self.name}.log"
        result = await self.svc.host.spawn(
            argv, dict(self.cfg.env), self.cfg.gpus, run_id, self.marker, log_path
        )
        if isinstance(result, SpawnFailed):
            self.log.error("server.spawn_failed", reason=result.reason)
            return result
        identity = await self.svc.host.identity(result)
        spec = spec_hash(argv, dict(self.cfg.env), self.cfg.gpus)
        self.owner.begin_run(result, run_id, argv, identity, spec, str(log_path))
        self.log.info("server.started", pid=result.pid, run_id=run_id, argv=redact_argv(list(argv)))
        return None

    async def launch_and_watch(self) -> Outcome:
        """Launch (never while an earlier run of this server lives), then watch until a fault or a command."""
        self.owner.transition(S.STARTING, "launching")
        if not await recovery.no_earlier_run(self):
            return Outcome()  # failed until an operator acts, or stopping: nothing launched
        if not await pd_peers.hold_prefill_relaunch(self):
            return Outcome()  # stopping or paused meanwhile: nothing launched
        held = await self.svc.host.foreign_port_holders(self.cfg)
        if held:
            return recovery.spawn_failure(
                self, SpawnFailed(f"a port is held by a process that is not ours: {'; '.join(held)}")
            )
        failed = await self.launch()
        if failed is not None:
            return recovery.spawn_failure(self, failed)
        return await self._watch.run()

    def became_serving(self, unproven: str, alert: bool = True) -> None:
        """Startup proven (or serving unproven): serving; resolve the open incident; PD follow-ups."""
        owner = self.owner
        now = owner.mark_serving()
        self.set_unproven(unproven, alert)
        owner.transition(S.SERVING, unproven or "health 200 and canary passed")
        self.svc.metrics.observe_startup(self.name, now - owner.started_at)
        closed = owner.close_incident()
        if closed is not None:
            incident, since = closed
            self.svc.metrics.observe_time_to_serving(self.name, now - since)
            self.svc.incidents.resolve(incident, self.clock.wall(), now - since)
        if self.cfg.role is Role.PREFILL and owner.launches > 1 and unproven and alert:
            pd_peers.restart_followers(self.svc, self.name, unproven, self.log)

    def set_unproven(self, why: str, alert: bool = True) -> None:
        """Serving without a passing canary (a warning unless `alert` is off: a PD worker awaiting its
        partner; and once the pair is up but the canary through it is not passing), or proven when `why` is ''."""
        was = self.owner.unproven
        waited = was.startswith(AWAITING) and bool(why) and not why.startswith(AWAITING)
        if not self.owner.set_unproven(why) and not waited:
            return
        if waited:
            self.owner.transition(self.owner.state, why)
        if why and alert:
            self.svc.incidents.notice(
                self.name,
                self.clock.wall(),
                "canary_unproven",
                "alert",
                why,
                {"probes": self._watch.snapshot()},
                self.owner.argv,
                self.owner.rung,
            )
        elif was and self.owner.state is S.SERVING:
            self.log.info("server.proven", was=was)
            self.owner.transition(S.SERVING, "canary passed")

    # ---- commands and waiting ------------------------------------------------------------------------------
    def handle_command(self, cmd: Command) -> str:
        """Apply pause/resume/stop at once; return the command kind for the caller's loop."""
        if cmd.kind == "pause" and not self.owner.paused:
            self.operator_entry("pause", cmd)
            self.owner.pause(f"paused by {cmd.actor}: {cmd.reason}")
        elif cmd.kind == "resume" and self.owner.paused:
            self.operator_entry("resume", cmd)
            self.owner.resume(resume_target, f"resumed by {cmd.actor}: {cmd.reason}")
        elif cmd.kind == "stop":
            self.stopping = True
        elif cmd.kind == "rung" and cmd.rung is not None:
            apply_rung(self, cmd, cmd.rung)
        cmd.answer("restarting" if cmd.kind == "restart" else cmd.kind)
        return cmd.kind

    def operator_entry(self, action: str, cmd: Command) -> None:
        """A control action in the journal, with who and why."""
        self.svc.incidents.operator(
            self.name, self.clock.wall(), action, cmd.reason, cmd.actor, self.owner.argv, self.owner.rung
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
                self.owner.end_streak()
                return

    # ---- status --------------------------------------------------------------------------------------------
    def gauges(self) -> ServerGauges:
        """What the metrics read at scrape time: the owner's state and whether SGLang's engine is paused."""
        return dataclasses.replace(self.owner.gauges(), engine_paused=engine_pause(self) is not None)

    def status(self) -> dict[str, Any]:
        """This server in `/status` (supervisor.loop.status_view)."""
        return server_status(self)
