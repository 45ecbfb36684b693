"""Watching one launch: every tick, observe (the tree, the probes), triage (policies), act (the loop).

Returns an `Outcome` to the server loop: a fault with the step decided for it (`ServerLoop.decide`, once), or
an operator command. Serving, serving unproven, degrading (an alert-only step) and faults seen while paused
are carried out here, through the server's owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policies import argv
from policies.decide import FaultStep, Next
from policies.model import (
    CANARY_PROBES,
    Observation,
    ProbeSettings,
    TreeView,
    canary_values,
    logs_values,
)
from policies.pd import Role
from policies.states import ServerState
from policies.triage import ServerFacts, TreeFacts, promotion, quiet, triage
from supervisor.gateway.drain import RestartGate
from supervisor.host import proctree
from supervisor.loop import pd_peers
from supervisor.loop.commands import Command, Outcome
from supervisor.loop.host import MonitorSpec, ProbeMonitor
from supervisor.records.incident import Incident
from supervisor.redaction import server_api_key

if TYPE_CHECKING:
    from policies.model import Fault
    from supervisor.loop.context import Loop

S = ServerState
# after a loss, let the reader take the dying process's last lines: until its output ends, at most this
LOG_SETTLE_S = 0.3
LOG_SETTLE_STEP_S = 0.02
TAIL_LINES = 300
ABORT_TIMEOUT_S = 5.0  # SGLang answers an abort at once; the loop must beat again well within its 10 s


# `[servers.probes]` keys that are ProbeSettings fields of the same name
SAME_NAMED = (
    "health_period_s", "health_timeout_s", "health_failures", "canary_period_s", "canary_timeout_s",
    "stream_canary_concurrency", "stream_canary_period_s", "stream_canary_first_s", "stall_after_s",
    "rank_stall_after_s", "stuck_request_min_s", "stuck_request_factor", "brownout_after_s", "brownout_fraction",
    "metrics_period_s", "canary_mode", "canary_inconclusive_limit", "max_pause_s",
)  # fmt: skip


def probe_settings(loop: Loop) -> ProbeSettings:
    """Probe settings from the server's current config."""
    p, cfg = loop.cfg.probes, loop.cfg
    expected = cfg.expected_parsers()
    return ProbeSettings(
        **{key: getattr(p, key) for key in SAME_NAMED},
        dp_size=cfg.dp_ranks,
        startup_budget_s=cfg.startup_budget_s,
        startup_silence_s=cfg.startup_silence_s,
        expected_tool_parser=expected[0] if expected else None,
        expected_reasoning_parser=expected[1] if expected else None,
        api_key=server_api_key(cfg),
    )


def model_name(args: tuple[str, ...], fallback: str | None) -> str:
    """The model name requests must carry: `--served-model-name` (as argparse reads it), else `--model-path`."""
    return argv.value(args, "--served-model-name") or fallback or "default"


class Watch:
    """Tree polling, the probes' monitor and the triage of each tick, for the current launch."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self.tree: proctree.TreeSnapshot | None = None
        self.cursor = 0
        self.monitor: ProbeMonitor | None = None
        self.seen_ranks: set[str] = set()
        self.degraded: tuple[Incident, float] | None = None  # the alert-only incident and when (monotonic)
        self.paused_fault = ""  # the fault kind journaled while paused (once per kind)
        self.resumed = False  # an operator's resume: the next tick judges what is true now, losses included
        self.resumed_at: float | None = None  # until a fresh lease reading, only what was seen since counts
        self.waiting_for = ""
        self.settings = ProbeSettings()  # this launch's, from the config (a reload replaces them)
        self._titles: list[str] | None = None
        self.gate = RestartGate(loop)  # a planned restart waiting for the gateway's min_available
        self.xids_seen: set[tuple[int, int, float]] = set()  # reported once per server, not once per launch

    # ---- what the host shows, for the monitor's readers
    def tree_view(self) -> TreeView:
        """The tree as the ranks probe reads it."""
        snap = self.tree
        if snap is None:
            return TreeView()
        return TreeView(
            snap.main_alive,
            tuple(r.title for r in snap.ranks if r.status == "missing" and r.title in self.seen_ranks),
            tuple(r.title for r in snap.ranks if r.status == "zombie"),
            {r.title: r.cpu_time_s for r in snap.ranks if r.cpu_time_s is not None},
            {r.title: r.state for r in snap.ranks if r.status == "running" and r.state},
        )

    def new_lines(self) -> list[str]:
        """Output lines of this run not read yet."""
        run = self.loop.owner.run
        if run is None:
            return []
        lines, self.cursor = run.lines_since(self.cursor)
        return lines

    def rank_pids(self) -> dict[int, str]:
        """The running ranks: pid → title (stacks and forensics dump these)."""
        snap = self.tree
        if snap is None:
            return {}
        return {r.pid: r.title for r in snap.ranks if r.pid is not None and r.status == "running"}

    def known_descendants(self) -> list[proctree.ProcId]:
        """Descendants seen alive in the last snapshot (the reaper checks them too)."""
        return list(self.tree.descendants) if self.tree else []

    def titles(self) -> list[str]:
        """The rank titles this server's tree must show (read from the config once per launch and reload)."""
        if self._titles is None:
            self._titles = self._expected_titles()
        return self._titles

    def _expected_titles(self) -> list[str]:
        cfg = self.loop.cfg
        if cfg.role is Role.ROUTER:
            return []
        layout = (cfg.tp_size, cfg.dp_ranks, cfg.pp_size, cfg.nnodes, cfg.node_rank)
        return proctree.expected_rank_titles(*layout, dp_attention=cfg.attn_dp_size > 1)

    def _new_monitor(self) -> ProbeMonitor:
        loop = self.loop
        base = loop.cfg.base_url
        self.settings, self._titles = probe_settings(loop), None
        spec = MonitorSpec(
            server=loop.name,
            role=loop.cfg.role.value,
            base_url=base,
            pd_pair=(lambda: pd_peers.pair(loop.svc, loop.name))
            if pd_peers.is_worker(loop.cfg.role)
            else None,
            model=model_name(loop.owner.argv[len(loop.cfg.command) :], loop.cfg.model_path),
            settings=self.settings,
            tree=self.tree_view,
            gpu=loop.svc.host.gpu_reader(loop.cfg.gpus),
            log_lines=self.new_lines,
            pids_for_stacks=self.rank_pids,
            xids_seen=self.xids_seen,
        )
        return loop.svc.host.monitor(spec)

    def reconfigure(self) -> None:
        """Probe settings of a reloaded config reach the probes at once."""
        self.settings, self._titles = probe_settings(self.loop), None
        if self.monitor is not None:
            self.monitor.reconfigure(self.settings)

    # ---- the watch
    async def run(self) -> Outcome:
        """Watch until a fault or a command; startup ends only when the triage says the gate is open."""
        loop = self.loop
        clock = loop.clock
        if self.monitor is not None:
            await self.monitor.aclose()
        self.monitor = self._new_monitor()  # per launch: this launch's port, model and settings
        self.tree, self.cursor, self.degraded, self.paused_fault = None, 0, None, ""
        self.seen_ranks, self.resumed, self.waiting_for = set(), False, ""
        self.resumed_at = None
        self.monitor.reset(clock.monotonic())
        run = loop.owner.run
        assert run is not None
        while True:
            loop.beat()
            while (cmd := loop.next_command()) is not None:
                if cmd.kind == "restart" and self.gate.needed():
                    self.gate.start(cmd)  # it waits for min_available while the watch goes on
                    continue
                paused = loop.owner.paused
                kind = loop.handle_command(cmd)
                if kind in ("restart", "stop"):
                    self.gate.cancel("the server is stopping")
                    return Outcome(command=cmd if kind == "restart" else None)
                if paused and not loop.owner.paused:
                    self.resumed, self.paused_fault = True, ""
                    self.resumed_at = loop.clock.monotonic()
            if (turn := self.gate.ready()) is not None:
                loop.handle_command(turn)
                return Outcome(command=turn)
            outcome = await self.tick(run)
            if outcome is not None:
                self.gate.cancel("a fault was decided first")
                return outcome
            # asleep until a process of the tree exits, a probe finishes or one is due (at most tick_s)
            pids = [run.pid, *self.rank_pids()]
            due = min(
                loop.svc.config.supervisor.tick_s, max(0.0, self.monitor.next_due() - clock.monotonic())
            )
            await loop.svc.host.wait_exit(pids, due, clock, self.monitor.ready)

    async def tick(self, run: Any) -> Outcome | None:
        """One observe → triage → act step."""
        loop, owner = self.loop, self.loop.owner
        assert self.monitor is not None
        now = loop.clock.monotonic()
        self.tree, events = await loop.svc.host.poll_tree(self.tree, run.pid, owner.run_id, self.titles())
        # a rank counts as lost only once it had appeared (ranks spawn during a load): the one rule, for the
        # tree's events here and for the ranks probe (tree_view)
        self.seen_ranks |= {r.title for r in self.tree.ranks if r.status == "running"}
        new = await self.monitor.tick(now)
        self._record(new)
        if self.resumed:  # what a pause saw is not replayed: only what is still true counts now
            self.resumed = False
            events = proctree.changes(None, self.tree)
        losses = self._losses(events)
        if not new and not losses:
            return None  # nothing new to triage: every rule's inputs are unchanged (time rules wait ≤ a probe period)
        if losses:  # the dying tree's last lines decide oom against crash
            settle_until = now + LOG_SETTLE_S
            while not run.output_ended() and loop.clock.monotonic() < settle_until:
                await loop.clock.sleep(LOG_SETTLE_STEP_S)
        facts = ServerFacts(
            role=loop.cfg.role.value,
            phase=owner.state.value if owner.state in (S.STARTING, S.SERVING, S.DEGRADED) else "serving",
            started_at=owner.started_at,
            settings=self.settings,
            prefills=pd_peers.prefills(loop.svc, loop.name, now),
            awaiting=pd_peers.awaiting(loop.svc, loop.name),
            unproven=owner.unproven,
        )
        tree = TreeFacts(
            tuple(losses), run.returncode() if losses else None, tuple(run.tail(TAIL_LINES) if losses else ())
        )
        window = self._since_resume(self.monitor.window())
        result = triage(window, tree, facts, now)
        if result.fault is not None:
            return await self._act_on_fault(result.fault)
        if result.serving and owner.state is S.STARTING:
            loop.became_serving(result.unproven, alert=not result.awaiting_partner)
        elif owner.state is S.STARTING and result.waiting_for != self.waiting_for:
            self.waiting_for = result.waiting_for
            owner.transition(S.STARTING, f"waiting for {result.waiting_for}")
        if owner.state in (S.SERVING, S.DEGRADED) and owner.unproven and (result.proven or result.unproven):
            loop.set_unproven("" if result.proven else result.unproven)
        if owner.state is S.DEGRADED and result.fault is None and self.degraded is not None:
            self._undegrade(result.cleared)
        if owner.state is S.SERVING and not owner.paused:
            return self._promotion(window, now)
        return None

    def _since_resume(self, window: list[Observation]) -> list[Observation]:
        """After a resume (or an abort), only observations made since, until the lease (a router: `/health`) was
        read again: a stall or a failing probe seen before counts only if a fresh reading still shows it."""
        if self.resumed_at is None:
            return window
        fresh = [o for o in window if o.at >= self.resumed_at]
        lease = "health" if self.loop.cfg.role is Role.ROUTER else "progress"
        if any(o.probe == lease for o in fresh):
            self.resumed_at = None
        return fresh

    async def _act_on_fault(self, fault: Fault) -> Outcome | None:
        """Carry out the step decided for `fault` (once, by the loop's `decide`)."""
        decided = self.loop.decide(fault)
        if decided.step is FaultStep.HOLD:
            self._observe_paused(fault, decided)
            return None
        if decided.step is FaultStep.ABORT:
            await self._abort(fault, decided)
            return None
        if decided.step is FaultStep.DEGRADE:
            self._degrade(fault, decided)
            return None
        return Outcome(fault=fault, decided=decided)

    def _promotion(self, window: list[Observation], now: float) -> Outcome | None:
        loop = self.loop
        policy = loop.cfg.policy
        due = promotion(
            loop.owner.levels,
            loop.owner.serving_since,
            now,
            quiet=quiet(window),
            enabled=policy.promote_back,
            after_s=policy.promote_after_s,
        )
        if due is None:
            return None
        return Outcome(command=Command("promote", due.reason, "supervisor", promotion=due))

    def _losses(self, events: list[proctree.TreeEvent]) -> list[str]:
        """Events that are real losses: a rank counts only once it had appeared (ranks spawn during a load)."""
        kept = [e for e in events if e.kind != "rank_lost" or e.title in self.seen_ranks]
        return [f"{e.kind} {e.title or e.pid}" for e in kept]

    def _record(self, observations: list[Observation]) -> None:
        metrics = self.loop.svc.metrics
        for obs in observations:
            result = "ok" if obs.ok else ("timeout" if "timeout" in obs.detail.lower() else "fail")
            metrics.probe(self.loop.name, obs.probe, result, obs.latency_s or 0.0)
            verdict = canary_values(obs).get("verdict") if obs.probe in CANARY_PROBES else None
            if verdict in ("pass", "fail", "inconclusive"):
                metrics.canary(self.loop.name, obs.probe, str(verdict))

    def _degrade(self, fault: Fault, decided: Next) -> None:
        """Alert only: the tree keeps serving, degraded. A launch that answers but fails only this way has
        started (serving, the open incident resolved) before it degrades."""
        if self.degraded is not None:
            return
        loop = self.loop
        if loop.owner.state is S.STARTING:
            loop.became_serving("")
        loop.owner.transition(S.DEGRADED, f"{fault.kind}: {fault.reason}")
        incident = loop.svc.incidents.notice(
            loop.name,
            loop.clock.wall(),
            fault.kind,
            "alert",
            f"{fault.reason} → {decided.plan.reason}; degraded, no restart",
            dict(fault.evidence),
            loop.owner.argv,
            loop.owner.rung,
        )
        self.degraded = (incident, loop.clock.monotonic())

    async def _abort(self, fault: Fault, decided: Next) -> None:
        """Abort the requests the fault names, or all (policies.abort): the tree keeps serving; an incident and its
        alert; the probes judge the abort on fresh readings (`policies.abort` decides the next step)."""
        loop, rids = self.loop, [str(r) for r in fault.evidence.get("rids", ())]
        timeout, key = min(self.settings.health_timeout_s, ABORT_TIMEOUT_S), server_api_key(loop.cfg)
        failed = await loop.svc.host.abort_requests(loop.cfg.base_url, key, timeout, rids)
        self.resumed_at = now = loop.clock.monotonic()
        if self.monitor is not None:
            self.monitor.note_abort(now, rids)
        loop.log.warning("requests.aborted", fault=fault.kind, rids=rids or "all", error=failed or None)
        why = f"{fault.reason} → {decided.plan.reason}" + (f"; the abort failed: {failed}" if failed else "")
        entry = (fault.kind, "abort failed" if failed else "abort", why, dict(fault.evidence))
        loop.svc.incidents.notice(loop.name, loop.clock.wall(), *entry, loop.owner.argv, loop.owner.rung)

    def _undegrade(self, cleared: frozenset[str]) -> None:
        """Degraded ends when the canary whose failure caused it passes again: serving, the alert resolved."""
        assert self.degraded is not None
        incident, since = self.degraded
        if incident.fault not in cleared:
            return
        loop = self.loop
        self.degraded = None
        loop.owner.transition(S.SERVING, f"{incident.fault} cleared: the newest canary passed")
        loop.svc.incidents.resolve(incident, loop.clock.wall(), loop.clock.monotonic() - since)

    def _observe_paused(self, fault: Fault, decided: Next) -> None:
        if self.paused_fault == fault.kind:
            return
        self.paused_fault = fault.kind
        loop = self.loop
        loop.log.warning("fault.observed_paused", fault=fault.kind, reason=fault.reason)
        loop.svc.incidents.notice(
            loop.name,
            loop.clock.wall(),
            fault.kind,
            "observed (paused)",
            fault.reason,
            dict(fault.evidence),
            loop.owner.argv,
            loop.owner.rung,
        )

    # ---- views
    def snapshot(self) -> dict[str, Any]:
        """Last probe values for `/status`."""
        return self.monitor.snapshot() if self.monitor else {}

    def latest(self, probe: str) -> Observation | None:
        """The newest observation of `probe` in this launch."""
        return self.monitor.latest(probe) if self.monitor else None

    def startup_view(self) -> dict[str, Any] | None:
        """What startup waits for and its last progress line, for `/status` while starting."""
        if self.loop.owner.state is not S.STARTING:
            return None
        logs = [o for o in self.monitor.window() if o.probe == "logs"] if self.monitor else []
        line = logs_values(max(logs, key=lambda o: o.at)).get("progress_line") if logs else None
        return {"waiting_for": self.waiting_for or "the launch", "progress": line}

    async def aclose(self) -> None:
        """Close the monitor's sessions."""
        if self.monitor is not None:
            await self.monitor.aclose()
