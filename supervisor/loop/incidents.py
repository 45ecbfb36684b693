"""The incident book: every incident is created, updated, journaled, counted, logged and alerted here.

One path for every kind of entry (a fault with its plan, a degraded server, a fault seen while paused, an operator
action, a canary that never proved the server), so they are recorded the same way.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import structlog

from policies.argv import redact as redact_argv
from policies.model import Fault
from policies.plan import Plan
from supervisor.alerts.dispatcher import AlertDispatcher
from supervisor.records.incident import Incident
from supervisor.records.journal import IncidentJournal
from supervisor.reporting.metrics import FAULT_KINDS, SupervisorMetrics

log = structlog.get_logger()
KEEP = 200


class IncidentBook:
    """The recent incidents in memory, the journal on disk, the metrics and the alerts."""

    def __init__(
        self, journal: IncidentJournal, metrics: SupervisorMetrics, alerts: AlertDispatcher | None
    ) -> None:
        self.journal = journal
        self.metrics = metrics
        self.alerts = alerts
        self.recent: deque[Incident] = deque(journal.load()[-KEEP:], maxlen=KEEP)
        self.unwritable: dict[str, Incident] = {}  # what cannot be written (journal, state) -> its open alert

    def _store(self, incident: Incident) -> None:
        self.recent = deque([i for i in self.recent if i.id != incident.id], maxlen=KEEP)
        self.recent.append(incident)
        try:
            self.journal.append(incident)
        except OSError as exc:
            log.error("journal.append_failed", error=str(exc), incident=incident.id)
            self.write_failed("journal", exc, incident.detected_at)
        else:
            self.write_ok("journal", incident.detected_at)

    def write_failed(self, what: str, exc: OSError, wall: float) -> None:
        """A file of the state dir could not be written (full disk, permissions): counted, alerted once.

        Supervision goes on (memory holds the state); the alert resolves when a write succeeds again.
        """
        self.metrics.write_failure(what)
        if what in self.unwritable:
            return
        alert = self._new(
            "supervisor",
            wall,
            "state_unwritable",
            "alert",
            f"cannot write the {what} in state_dir: {exc.strerror or exc}; supervision continues from memory",
            {"file": what, "errno": exc.errno},
            (),
            0,
            severity="page",
        )
        self.unwritable[what] = alert
        self.recent.append(alert)
        log.error("state.unwritable", what=what, error=str(exc))
        self._fire(alert)

    def write_ok(self, what: str, wall: float) -> None:
        """A write succeeded: resolve the open unwritable alert of `what`, if any."""
        alert = self.unwritable.pop(what, None)
        if alert is None:
            return
        resolved = alert.resolve(wall, wall - alert.detected_at)
        self._store(resolved)
        log.info("state.writable", what=what)
        if self.alerts is not None:
            self.alerts.resolve(resolved)

    def _fire(self, incident: Incident) -> None:
        if self.alerts is not None:
            self.alerts.fire(incident)

    @staticmethod
    def _new(
        server: str,
        wall: float,
        fault: str,
        action: str,
        reason: str,
        evidence: dict[str, Any],
        argv: tuple[str, ...],
        rung: int,
        **kw: Any,
    ) -> Incident:
        stamp = datetime.fromtimestamp(wall, UTC).strftime("%Y%m%dT%H%M%S")
        return Incident(
            id=f"{stamp}-{server}-{uuid.uuid4().hex[:6]}",
            server=server,
            fault=fault,
            detected_at=wall,
            evidence=evidence,
            action=action,
            reason=reason,
            argv_before=tuple(redact_argv(list(argv))),
            rung=rung,
            **kw,
        )

    def draft_fault(
        self,
        server: str,
        wall: float,
        fault: Fault,
        plan: Plan,
        argv: tuple[str, ...],
        rung: int,
        detection_latency_s: float | None,
    ) -> Incident:
        """The incident of a fault and its plan, not yet recorded (a recovery puts its id on disk first)."""
        return self._new(
            server,
            wall,
            fault.kind,
            plan.action,
            f"{fault.reason} → {plan.reason}",
            {**dict(fault.evidence), "confidence": fault.confidence},
            argv,
            rung,
            severity="page" if plan.page else "warning",
            detection_latency_s=detection_latency_s,
        )

    def record_fault(self, incident: Incident) -> Incident:
        """A drafted fault incident: journaled, counted, logged, alerted."""
        self._store(incident)
        self.metrics.incident(incident.server, incident.fault)
        latency = incident.detection_latency_s
        if latency is not None:
            self.metrics.observe_detection(incident.fault, latency)
        log.warning(
            "fault.detected",
            server=incident.server,
            incident=incident.id,
            fault=incident.fault,
            reason=incident.reason,
            action=incident.action,
            detection_latency_s=latency,
        )
        self._fire(incident)
        return incident

    def update(self, incident: Incident) -> None:
        """A later fact about an incident (forensics path, argv after, release report); secrets redacted."""
        self._store(replace(incident, argv_after=tuple(redact_argv(list(incident.argv_after)))))

    def page(self, incident: Incident, reason: str) -> Incident:
        """The server is failed: escalate the incident (same dedup key) with the reason."""
        updated = replace(
            incident, action="failed", reason=f"{incident.reason}; FAILED: {reason}", severity="page"
        )
        self._store(updated)
        self._fire(updated)
        return updated

    def resolve(self, incident: Incident, wall: float, time_to_serving_s: float) -> Incident:
        """Serving again after `incident`: mark it recovered and send the resolved alert."""
        resolved = incident.resolve(wall, time_to_serving_s)
        self._store(resolved)
        log.info(
            "recovery.complete",
            server=incident.server,
            incident=incident.id,
            time_to_serving_s=round(time_to_serving_s, 3),
        )
        if self.alerts is not None:
            self.alerts.resolve(resolved)
        return resolved

    def notice(
        self,
        server: str,
        wall: float,
        kind: str,
        action: str,
        reason: str,
        evidence: dict[str, Any],
        argv: tuple[str, ...],
        rung: int,
        severity: str = "warning",
    ) -> Incident:
        """An entry that is not acted on: degraded, seen while paused, serving unproven.

        Only fault kinds are counted in `incidents_total`; `canary_unproven` has a gauge of its own, and group
        events (`group.*`) have the group metrics.
        """
        incident = self._new(server, wall, kind, action, reason, evidence, argv, rung, severity=severity)
        self._store(incident)
        if kind in FAULT_KINDS:
            self.metrics.incident(server, kind)
        log.warning("fault.noticed", server=server, incident=incident.id, fault=kind, action=action)
        self._fire(incident)
        return incident

    def operator(
        self, server: str, wall: float, action: str, reason: str, actor: str, argv: tuple[str, ...], rung: int
    ) -> Incident:
        """Every control action is a journal entry with who and why."""
        incident = self._new(
            server,
            wall,
            "operator",
            action,
            reason or "(no reason given)",
            {"source": "control"},
            argv,
            rung,
            severity="info",
            actor=actor,
        )
        self._store(incident)
        log.info("control.action", server=server, action=action, actor=actor, reason=reason)
        return incident

    def interrupted(self, incident_id: str, wall: float) -> Incident | None:
        """The daemon died while recovering from `incident_id`: mark it interrupted (journaled) and return it,
        so the recovery that follows completes it; None when it is not in the journal's recent entries."""
        found = next((i for i in reversed(self.recent) if i.id == incident_id), None)
        if found is None or found.recovered_at is not None:
            return None
        marked = replace(
            found,
            reason=f"{found.reason}; the daemon restarted mid-recovery",
            evidence={**found.evidence, "interrupted_at": wall},
        )
        self._store(marked)
        log.warning("recovery.interrupted", server=found.server, incident=found.id)
        return marked

    def last(self, server: str) -> Incident | None:
        """The newest incident of a server."""
        for incident in reversed(self.recent):
            if incident.server == server:
                return incident
        return None
