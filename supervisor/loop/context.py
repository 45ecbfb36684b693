"""Daemon-wide services shared by the server runtimes: config, state file, metrics, journal, alerts, incidents.

Incidents are created, updated, journaled, counted and alerted here, so every path records them the same way.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from policies.pd import Role
from policies.plan import Plan
from policies.states import ServerState
from supervisor.alerts.dispatcher import AlertDispatcher
from supervisor.config import Config
from supervisor.host.forensics import capture
from supervisor.host.gpu import GpuBackend
from supervisor.records.incident import Incident
from supervisor.records.journal import IncidentJournal
from supervisor.records.statefile import StateFile
from supervisor.reporting.metrics import SupervisorMetrics

if TYPE_CHECKING:
    from supervisor.loop.runtime import Command, ServerRuntime
    from supervisor.loop.watch import Outcome

log = structlog.get_logger()


class Context:
    """What every runtime shares; the daemon owns it."""

    def __init__(
        self,
        config: Config,
        statefile: StateFile,
        metrics: SupervisorMetrics,
        gpu_backend: GpuBackend,
        journal: IncidentJournal,
        alerts: AlertDispatcher | None,
        on_state_change: Callable[[], None],
    ) -> None:
        self.config = config
        self.statefile = statefile
        self.metrics = metrics
        self.gpu_backend = gpu_backend
        self.journal = journal
        self.alerts = alerts
        self.on_state_change = on_state_change
        self.runtimes: dict[str, ServerRuntime] = {}
        self.incidents: deque[Incident] = deque(journal.load()[-200:], maxlen=200)

    def save_state(self) -> None:
        """Persist state.json."""
        try:
            self.statefile.save()
        except OSError as exc:
            log.error("state.save_failed", error=str(exc))

    # ---- incidents ---------------------------------------------------------------------------------------
    def _store(self, incident: Incident) -> None:
        self.incidents = deque([i for i in self.incidents if i.id != incident.id], maxlen=200)
        self.incidents.append(incident)
        try:
            self.journal.append(incident)
        except OSError as exc:
            log.error("journal.append_failed", error=str(exc), incident=incident.id)

    def _new(
        self, rt: ServerRuntime, fault: str, action: str, reason: str, evidence: dict[str, Any], **kw: Any
    ) -> Incident:
        return Incident(
            id=f"{time.strftime('%Y%m%dT%H%M%S')}-{rt.name}-{uuid.uuid4().hex[:6]}",
            server=rt.name,
            fault=fault,
            detected_at=time.time(),
            evidence=evidence,
            action=action,
            reason=reason,
            argv_before=tuple(rt.argv),
            rung=rt.rung,
            **kw,
        )

    def new_incident(self, rt: ServerRuntime, outcome: Outcome, plan: Plan) -> Incident:
        """A fault was detected and a plan chosen: record, count and alert it."""
        latency = outcome.evidence.get("detection_latency_s")
        incident = self._new(
            rt,
            outcome.fault_kind,
            plan.action,
            f"{outcome.reason} → {plan.reason}",
            {**outcome.evidence, "confidence": outcome.confidence},
            severity="page" if plan.page else "warning",
            detection_latency_s=float(latency) if isinstance(latency, int | float) else None,
        )
        rt.open_incident = incident
        self._store(incident)
        self.metrics.incident(rt.name, outcome.fault_kind)
        if incident.detection_latency_s is not None:
            self.metrics.observe_detection(outcome.fault_kind, incident.detection_latency_s)
        log.warning(
            "fault.detected",
            server=rt.name,
            incident=incident.id,
            fault=outcome.fault_kind,
            reason=outcome.reason,
            action=plan.action,
        )
        if self.alerts is not None:
            self.alerts.fire(incident)
        return incident

    def update_incident(self, rt: ServerRuntime, incident: Incident) -> None:
        """A later fact about an incident (forensics path, argv after, recovery)."""
        if rt.open_incident is not None and rt.open_incident.id == incident.id:
            rt.open_incident = incident
        self._store(incident)

    def page(self, incident: Incident, reason: str) -> None:
        """The server is failed: escalate the incident (same dedup key) with the reason."""
        updated = replace(
            incident, action="failed", reason=f"{incident.reason}; FAILED: {reason}", severity="page"
        )
        self._store(updated)
        if self.alerts is not None:
            self.alerts.fire(updated)

    def degraded_incident(self, rt: ServerRuntime, outcome: Outcome) -> None:
        """Serving but wrong in a way a restart would not fix: alert, don't act."""
        incident = self._new(
            rt,
            outcome.fault_kind,
            "alert",
            f"{outcome.reason} → degraded, no restart",
            outcome.evidence,
            severity="warning",
        )
        self._store(incident)
        self.metrics.incident(rt.name, outcome.fault_kind)
        if self.alerts is not None:
            self.alerts.fire(incident)

    def paused_incident(self, rt: ServerRuntime, outcome: Outcome) -> None:
        """A fault seen while paused: recorded and reported, never acted on."""
        incident = self._new(
            rt, outcome.fault_kind, "observed (paused)", outcome.reason, outcome.evidence, severity="warning"
        )
        self._store(incident)
        self.metrics.incident(rt.name, outcome.fault_kind)
        if self.alerts is not None:
            self.alerts.fire(incident)

    def operator_incident(self, rt: ServerRuntime, action: str, cmd: Command) -> None:
        """Every control action is a journal entry with who and why."""
        incident = self._new(
            rt,
            "operator",
            action,
            cmd.reason or "(no reason given)",
            {"source": "control"},
            severity="info",
            actor=cmd.actor,
        )
        self._store(incident)
        log.info("control.action", server=rt.name, action=action, actor=cmd.actor, reason=cmd.reason)

    def became_serving(self, rt: ServerRuntime) -> None:
        """Startup proven (health 200 and canary passed): serving; resolve the open incident; PD ordering."""
        now = time.monotonic()
        rt.serving_since = now
        rt.transition(ServerState.SERVING, "health 200 and canary passed")
        self.metrics.observe_time_to_serving(rt.name, now - rt.started_at)
        incident = rt.open_incident
        if incident is not None:
            resolved = incident.resolve(time.time(), time.time() - incident.detected_at)
            rt.open_incident = None
            self._store(resolved)
            log.info(
                "recovery.complete",
                server=rt.name,
                incident=incident.id,
                time_to_serving_s=resolved.time_to_serving_s,
            )
            if self.alerts is not None:
                self.alerts.resolve(resolved)
        if rt.cfg.role is Role.PREFILL and rt.launch_count > 1:
            self.restart_decodes(rt.name)

    def restart_decodes(self, prefill: str) -> None:
        """SGLang decode caches prefill endpoints: any prefill restart is followed by a decode restart."""
        from supervisor.loop.runtime import Command

        for name, other in self.runtimes.items():
            if other.cfg.role is Role.DECODE and other.state in (
                ServerState.SERVING,
                ServerState.DEGRADED,
                ServerState.STARTING,
            ):
                other.commands.put_nowait(
                    Command("restart", f"prefill {prefill} was restarted", actor="supervisor")
                )
                log.info("pd.restart_decode", decode=name, prefill=prefill)

    def last_incident(self, server: str) -> Incident | None:
        """The newest incident of a server."""
        for incident in reversed(self.incidents):
            if incident.server == server:
                return incident
        return None

    def router_url_for(self, rt: ServerRuntime) -> str | None:
        """A decode's canary goes through the router when there is one."""
        if rt.cfg.role is not Role.DECODE:
            return None
        for cfg in self.config.servers:
            if cfg.role is Role.ROUTER:
                return f"http://127.0.0.1:{cfg.http_port}"
        return None

    async def capture_forensics(self, rt: ServerRuntime, incident: Incident) -> str:
        """Evidence before the kill, within the time budget; the bundle's path ('' if it could not be written)."""
        return await capture(self.config.supervisor, rt, incident)
