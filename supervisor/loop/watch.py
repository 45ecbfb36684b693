"""Watching one launch: the process tree every tick, the probes' monitor, startup then serving.

Returns an `Outcome` to the server's loop: a fault to recover from, or an operator command.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from policies.pd import Role
from policies.signatures import scan
from policies.states import FaultKind, ServerState
from probes.base import Observation
from probes.monitor import Monitor
from probes.settings import ProbeSettings
from supervisor.host import proctree

if TYPE_CHECKING:
    from supervisor.loop.runtime import Command, ServerRuntime

S = ServerState
# a server that answers /health but wedges on its first canary is not merely slow to start
STARTUP_WEDGES = {
    FaultKind.DECODE_WEDGE,
    FaultKind.COLLECTIVE_HANG,
    FaultKind.PD_TRANSFER_WEDGE,
    FaultKind.GPU_FAULT,
}
LOG_SETTLE_S = 0.3
CANARY_PROBES = {"canary_tool", "canary_reasoning", "canary_stream", "config_check"}


@dataclass
class Outcome:
    """Why watching ended."""

    fault_kind: str = ""
    reason: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    command: Command | None = None
    restart: bool = True
    confidence: float = 1.0


@dataclass(frozen=True)
class TreeView:
    """The process tree as the probes see it."""

    main_alive: bool
    missing_ranks: list[str]
    zombie_ranks: list[str]
    rank_cpu_s: dict[str, float]


def settings_for(rt: ServerRuntime) -> ProbeSettings:
    """Probe settings from the server's config."""
    p = rt.cfg.probes
    expected = rt.cfg.expected_parsers()
    return ProbeSettings(
        health_period_s=p.health_period_s,
        health_timeout_s=p.health_timeout_s,
        health_failures=p.health_failures,
        canary_period_s=p.canary_period_s,
        canary_timeout_s=p.canary_timeout_s,
        stream_canary_concurrency=p.stream_canary_concurrency,
        stream_canary_period_s=p.stream_canary_period_s,
        stall_after_s=p.stall_after_s,
        metrics_period_s=p.metrics_period_s,
        startup_budget_s=rt.cfg.startup_budget_s,
        startup_silence_s=rt.cfg.startup_silence_s,
        expected_tool_parser=expected[0] if expected else None,
        expected_reasoning_parser=expected[1] if expected else None,
    )


class Watcher:
    """Tree polling and probe scheduling for the current launch of a server."""

    def __init__(self, rt: ServerRuntime) -> None:
        self.rt = rt
        self.tree: proctree.TreeSnapshot | None = None
        self.cursor = 0
        self.monitor: Monitor | None = None
        self.alerted_degraded = False
        self.paused_fault: str = ""
        self.paused_outcome: Outcome | None = None
        self.seen_ranks: set[str] = set()

    def base_url(self) -> str:
        """Where the server listens (loopback when it binds all interfaces)."""
        host = "127.0.0.1"
        return f"http://{host}:{self.rt.cfg.http_port}"

    def model_name(self) -> str:
        """The model name requests must carry: `--served-model-name`, else `--model-path`."""
        args = list(self.rt.argv)
        for i, a in enumerate(args):
            if a == "--served-model-name" and i + 1 < len(args):
                return args[i + 1]
            if a.startswith("--served-model-name="):
                return a.split("=", 1)[1]
        return self.rt.cfg.model_path or "default"

    def _titles(self) -> list[str]:
        if self.rt.cfg.role.value == "router":
            return []
        return proctree.expected_rank_titles(self.rt.cfg.tp_size, self.rt.cfg.dp_size, self.rt.cfg.pp_size)

    def _tree_view(self) -> TreeView:
        snap = self.tree
        if snap is None:
            return TreeView(True, [], [], {})
        return TreeView(
            snap.main_alive,
            [r.title for r in snap.ranks if r.status == "missing"],
            [r.title for r in snap.ranks if r.status == "zombie"],
            {r.title: r.cpu_time_s for r in snap.ranks if r.cpu_time_s is not None},
        )

    def _gpu_dicts(self) -> list[dict[str, Any]]:
        samples = self.rt.ctx.gpu_backend.snapshot(list(self.rt.cfg.gpus))
        return [s.to_json() for s in samples]

    def _new_lines(self) -> list[str]:
        launched = self.rt.launched
        if launched is None:
            return []
        lines, self.cursor = launched.lines_since(self.cursor)
        return lines

    def _rank_pids(self) -> dict[int, str]:
        snap = self.tree
        if snap is None:
            return {}
        return {r.pid: r.title for r in snap.ranks if r.pid is not None and r.status == "running"}

    def known_descendants(self) -> list[proctree.ProcId]:
        """Descendants seen alive in the last snapshot (the reaper checks them too)."""
        return list(self.tree.descendants) if self.tree else []

    def _new_monitor(self) -> Monitor:
        ctx = self.rt.ctx
        return Monitor(
            server=self.rt.name,
            role=self.rt.cfg.role.value,
            base_url=self.base_url(),
            model=self.model_name(),
            settings=settings_for(self.rt),
            tree=self._tree_view,
            gpu=self._gpu_dicts if ctx.config.supervisor.gpu_backend != "none" else None,
            log_lines=self._new_lines,
            pids_for_stacks=self._rank_pids,
            router_url=ctx.router_url_for(self.rt),
        )

    def _record(self, observations: list[Observation]) -> None:
        metrics = self.rt.ctx.metrics
        for obs in observations:
            result = "ok" if obs.ok else ("timeout" if "timeout" in obs.detail.lower() else "fail")
            metrics.probe(self.rt.name, obs.probe, result, obs.latency_s or 0.0)
            verdict = obs.values.get("verdict") if obs.probe in CANARY_PROBES else None
            if isinstance(verdict, str) and verdict in ("pass", "fail", "inconclusive"):
                metrics.canary(self.rt.name, obs.probe, verdict)

    async def watch(self) -> Outcome:
        """Watch until a fault or a command; startup ends only when /health is 200 and the canary passes."""
        rt = self.rt
        if self.monitor is None:
            self.monitor = self._new_monitor()
        monitor = self.monitor
        self.tree, self.cursor, self.alerted_degraded, self.paused_fault = None, 0, False, ""
        self.seen_ranks, self.paused_outcome = set(), None
        monitor.reset(time.monotonic())
        launched = rt.launched
        assert launched is not None
        tick = rt.ctx.config.supervisor.tick_s
        while True:
            while not rt.commands.empty():
                cmd = rt.commands.get_nowait()
                kind = rt.handle_command(cmd)
                if kind in ("restart", "stop"):
                    return Outcome(command=cmd if kind == "restart" else None)
            if self.paused_outcome is not None and not rt.paused:
                held, self.paused_outcome = self.paused_outcome, None
                return held  # resumed: act on the fault seen while paused
            now = time.monotonic()
            self.tree, events = await asyncio.to_thread(
                proctree.poll_tree, self.tree, launched.pid, rt.run_id, self._titles()
            )
            self._record(await monitor.tick(now))
            if self._lost(events):
                await asyncio.sleep(LOG_SETTLE_S)  # let the reader take the dying process's last lines
            outcome = self._tree_fault(events, monitor, now) or self._probe_fault(monitor, now)
            if outcome is not None and outcome.command is not None:
                return outcome
            if outcome is not None:
                if rt.paused:
                    self._observe_paused(outcome)
                elif not outcome.restart:
                    self._degrade(outcome)
                else:
                    return outcome
            await asyncio.sleep(tick)

    def _lost(self, events: list[proctree.TreeEvent]) -> list[proctree.TreeEvent]:
        """Events that are real losses: a rank counts only once it had appeared (ranks spawn during a load)."""
        if self.tree is not None:
            self.seen_ranks |= {r.title for r in self.tree.ranks if r.status == "running"}
        return [e for e in events if e.kind != "rank_lost" or e.title in self.seen_ranks]

    def _tree_fault(self, events: list[proctree.TreeEvent], monitor: Monitor, now: float) -> Outcome | None:
        events = self._lost(events)
        if not events:
            return None
        launched = self.rt.launched
        code = launched.returncode() if launched else None
        evidence: dict[str, Any] = {
            "probe": "ranks",
            "events": [{"kind": e.kind, "pid": e.pid, "title": e.title} for e in events],
            "exit_code": code,
            "log_tail": launched.tail(20) if launched else [],
        }
        starting = self.rt.state is S.STARTING
        # the dying process's last lines say why (OOM, Xid, IMA) before the probes' log watch reads them
        fatal = [h for h in scan(launched.tail(300) if launched else []) if h.signature.fatal]
        tags = sorted({h.signature.tag for h in fatal if h.signature.tag})
        for kind in (FaultKind.GPU_FAULT, FaultKind.OOM):
            lines = [h.line for h in fatal if h.signature.kind == kind][-3:]
            if lines:
                why = f"{kind.value} in the log: {lines[-1][:200]}"
                return Outcome(kind.value, why, {**evidence, "log_hits": lines, "tags": tags})
        diagnosed = monitor.diagnose(now, "starting" if starting else "serving")
        if diagnosed is not None and diagnosed.kind in (FaultKind.GPU_FAULT, FaultKind.COLLECTIVE_HANG):
            return Outcome(diagnosed.kind, diagnosed.reason, {**evidence, **dict(diagnosed.evidence)})
        if tags:
            evidence["tags"] = tags
        what = "; ".join(f"{e.kind} {e.title or e.pid}" for e in events)
        kind = FaultKind.STARTUP_FAILURE if starting else FaultKind.CRASH
        return Outcome(kind.value, f"{what} (exit code {code})", evidence)

    def _probe_fault(self, monitor: Monitor, now: float) -> Outcome | None:
        rt = self.rt
        if rt.cfg.role is Role.ROUTER:
            return self._router_fault(monitor, now)
        if rt.state is S.STARTING:
            view = monitor.startup(now)
            if view.failed:
                fault = monitor.diagnose(now, "starting")
                if fault is not None and fault.kind == FaultKind.PARSER_MISCONFIG:
                    return Outcome(fault.kind, fault.reason, dict(fault.evidence))
                return Outcome(
                    FaultKind.PARSER_MISCONFIG.value,
                    "the parser canary failed",
                    {"probes": monitor.snapshot()},
                )
            if view.stalled or view.over_budget:
                why = "startup budget exceeded" if view.over_budget else "logs silent during startup"
                return Outcome(
                    FaultKind.STARTUP_STALLED.value, why, {"probe": "logs", "progress": view.progress}
                )
            if view.health_ok and view.canary_ok:
                rt.ctx.became_serving(rt)
                return None
            fault = monitor.diagnose(now, "starting")
            if fault is not None and fault.kind in STARTUP_WEDGES:
                return Outcome(fault.kind, fault.reason, dict(fault.evidence), confidence=fault.confidence)
            return None
        fault = monitor.diagnose(now, rt.state.value if rt.state in (S.SERVING, S.DEGRADED) else "serving")
        if fault is None:
            if rt.state is S.SERVING and not rt.paused:
                progress = monitor.snapshot().get("probes", {}).get("progress", {})
                promote = rt.promotion_due(now, quiet=not progress.get("values", {}).get("work", True))
                if promote is not None:
                    return Outcome(command=promote)
            return None
        return Outcome(
            fault.kind, fault.reason, dict(fault.evidence), restart=fault.restart, confidence=fault.confidence
        )

    def _router_fault(self, monitor: Monitor, now: float) -> Outcome | None:
        """The router is judged on its own liveness only: wedges behind it belong to the decode or prefill."""
        rt = self.rt
        if rt.state is S.STARTING:
            if monitor.startup(now).health_ok:
                rt.ctx.became_serving(rt)
            return None
        fault = monitor.diagnose(now, "serving")
        if fault is not None and fault.kind == FaultKind.HEALTH_UNRESPONSIVE:
            return Outcome(fault.kind, fault.reason, dict(fault.evidence), confidence=fault.confidence)
        return None

    def _degrade(self, outcome: Outcome) -> None:
        if self.alerted_degraded:
            return
        self.alerted_degraded = True
        self.rt.transition(S.DEGRADED, f"{outcome.fault_kind}: {outcome.reason}")
        self.rt.ctx.degraded_incident(self.rt, outcome)

    def _observe_paused(self, outcome: Outcome) -> None:
        if self.paused_fault == outcome.fault_kind:
            return
        self.paused_fault = outcome.fault_kind
        if outcome.restart:
            self.paused_outcome = outcome
        self.rt.log.warning("fault.observed_paused", fault=outcome.fault_kind, reason=outcome.reason)
        self.rt.ctx.paused_incident(self.rt, outcome)

    def snapshot(self) -> dict[str, Any]:
        """Last probe values for `/status`."""
        return self.monitor.snapshot() if self.monitor else {}

    def startup_view(self) -> dict[str, Any] | None:
        """Startup progress for `/status` while starting."""
        if self.monitor is None or self.rt.state is not S.STARTING:
            return None
        view = self.monitor.startup(time.monotonic())
        return {"progress": view.progress, "health_ok": view.health_ok, "canary_ok": view.canary_ok}

    async def aclose(self) -> None:
        """Close the monitor's sessions."""
        if self.monitor is not None:
            await self.monitor.aclose()
