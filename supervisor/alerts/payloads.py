"""Alert sinks: what each one sends, the HMAC signature of the generic webhook, and reading their secrets.

Payload builders are pure functions: an `Incident` and a status (`firing` or `resolved`) in, JSON-ready data
out. Each sink turns them into one `SinkRequest`; `supervisor.alerts.dispatcher.AlertDispatcher` sends it. Secrets
(webhook URLs with tokens, routing keys, HMAC keys) travel as pydantic's `SecretStr`, whose repr hides the value.

Generic webhook signature
-------------------------
With an HMAC secret configured, every generic-webhook request carries two headers (without one, neither)::

    X-SGLSup-Timestamp: <Unix seconds, integer>
    X-SGLSup-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>

A receiver verifies it on the *raw* request bytes (before any JSON parsing) by recomputing the HMAC,
comparing in constant time, and rejecting timestamps more than a few minutes from its own clock (the
timestamp is inside the signed bytes, so a captured request cannot be replayed later with a new one).
`sign` and `verify_signature` below use only the stdlib, so receivers can copy them as they are.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from supervisor import packaged
from supervisor.records.incident import Incident

ALERT_NAME = "SglangSupervisorIncident"
TIMESTAMP_HEADER = "X-SGLSup-Timestamp"
SIGNATURE_HEADER = "X-SGLSup-Signature"
FIRING = "firing"
RESOLVED = "resolved"

_MAX_SECRET_BYTES = 64 * 1024
_SEVERITY = {
    "page": "critical",
    "critical": "critical",
    "ticket": "warning",
    "warning": "warning",
    "info": "info",
}
_PAGERDUTY_SEVERITIES = ("critical", "error", "warning", "info")


def severity(incident: Incident) -> str:
    """The alert severity label (`critical`, `warning` or `info`) of an incident's severity."""
    return _SEVERITY.get(incident.severity, "warning")


def pagerduty_severity(incident: Incident) -> str:
    """PagerDuty's `payload.severity` (`critical`, `error`, `warning`, `info`)."""
    if incident.severity in _PAGERDUTY_SEVERITIES:
        return incident.severity
    return severity(incident)


def runbook_url(base: str, fault: str) -> str:
    """The runbook section of a fault kind: `<base>#<fault>` (base: `[alerts] runbook_url`)."""
    return f"{base}#{fault}"


def rfc3339(unix_s: float) -> str:
    """Unix seconds as an RFC 3339 UTC timestamp with milliseconds."""
    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def summary(incident: Incident, status: str) -> str:
    """One line for a human: what, where, and whether it is over."""
    if status == RESOLVED:
        return f"RESOLVED: {incident.fault} on server {incident.server} (incident {incident.id})"
    return f"{incident.fault} on server {incident.server} (incident {incident.id})"


def description(incident: Incident) -> str:
    """A few lines: what the supervisor decided and did about the incident."""
    parts = [
        f"Fault {incident.fault} detected on server {incident.server} at {rfc3339(incident.detected_at)}."
    ]
    if incident.action:
        parts.append(f"Action: {incident.action} (rung {incident.rung}).")
    if incident.reason:
        parts.append(f"Reason: {incident.reason}")
    if incident.flags_added or incident.flags_removed:
        parts.append(f"Flags added: {list(incident.flags_added)}; removed: {list(incident.flags_removed)}.")
    if incident.recovered_at is not None:
        parts.append(f"Serving again at {rfc3339(incident.recovered_at)}.")
    return " ".join(parts)


def generic_payload(incident: Incident, status: str, runbook: str, source: str) -> dict[str, Any]:
    """The generic JSON webhook body: status, summary and the whole incident record."""
    return {
        "version": "1",
        "type": f"incident.{status}",
        "status": status,
        "source": source,
        "severity": severity(incident),
        "summary": summary(incident, status),
        "description": description(incident),
        "runbook_url": runbook,
        "incident": incident.to_json(),
    }


def slack_payload(incident: Incident, status: str, runbook: str, source: str) -> dict[str, Any]:
    """A Slack incoming-webhook body: `text` fallback plus section and context blocks."""
    icon = ":white_check_mark:" if status == RESOLVED else ":rotating_light:"
    text = f"{icon} {summary(incident, status)}"
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{text}*\n{description(incident)}"}},
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": f"host `{source}` · severity {severity(incident)}"},
                    {"type": "mrkdwn", "text": f"<{runbook}|Runbook: {incident.fault}>"},
                ],
            },
        ],
    }


def pagerduty_payload(
    incident: Incident, status: str, routing_key: str, runbook: str, source: str
) -> dict[str, Any]:
    """A PagerDuty Events v2 `trigger` or `resolve`; the dedup key is the incident id."""
    if status == RESOLVED:
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": incident.id}
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": incident.id,
        "payload": {
            "summary": summary(incident, status)[:1024],
            "source": source,
            "severity": pagerduty_severity(incident),
            "timestamp": rfc3339(incident.detected_at),
            "component": incident.server,
            "group": "sglang",
            "class": incident.fault,
            "custom_details": {
                "action": incident.action,
                "reason": incident.reason,
                "rung": incident.rung,
                "evidence": incident.evidence,
            },
        },
        "links": [{"href": runbook, "text": f"Runbook: {incident.fault}"}],
        "client": "sglang-supervisor",
    }


def alertmanager_payload(
    incident: Incident, status: str, runbook: str, source: str, now: float, firing_ttl_s: float
) -> list[dict[str, Any]]:
    """The `POST /api/v2/alerts` body; a resolve re-sends the same labels with `endsAt` in the past."""
    if status == RESOLVED:
        ends_at = min(now, incident.recovered_at if incident.recovered_at is not None else now)
    else:
        ends_at = now + firing_ttl_s
    return [
        {
            "labels": {
                "alertname": ALERT_NAME,
                "server": incident.server,
                "fault": incident.fault,
                "severity": severity(incident),
                "incident": incident.id,
                "instance": source,
            },
            "annotations": {
                "summary": summary(incident, FIRING),
                "description": description(incident),
                "runbook_url": runbook,
            },
            "startsAt": rfc3339(incident.detected_at),
            "endsAt": rfc3339(ends_at),
        }
    ]


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The `X-SGLSup-Signature` value: `sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>`."""
    mac = hmac.new(secret, timestamp.encode("utf-8") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(
    secret: bytes, timestamp: str, body: bytes, header: str, now: float, max_skew_s: float = 300.0
) -> bool:
    """True if `header` signs exactly `timestamp` + "." + `body` and the timestamp is fresh.

    `timestamp` is the X-SGLSup-Timestamp header, `header` the X-SGLSup-Signature header, `body` the raw
    request bytes, `now` the receiver's Unix time. Constant-time comparison; never raises on bad input.
    """
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent_at) > max_skew_s:
        return False
    expected = sign(secret, timestamp, body).encode()
    return hmac.compare_digest(expected, header.encode("utf-8", "replace"))


def secret_from_file(path: str | Path) -> SecretStr:
    """Read a secret file (e.g. under `$CREDENTIALS_DIRECTORY`), surrounding whitespace stripped."""
    with Path(path).open("rb") as f:
        data = f.read(_MAX_SECRET_BYTES + 1)
    if len(data) > _MAX_SECRET_BYTES or not data.strip():
        raise ValueError(f"secret file {path} is empty or larger than {_MAX_SECRET_BYTES} bytes")
    try:
        return SecretStr(data.decode("utf-8").strip())
    except UnicodeDecodeError:
        raise ValueError(f"secret file {path} is not UTF-8 text") from None


def secret_from_env(name: str) -> SecretStr:
    """Read a secret from an environment variable."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"environment variable {name} is not set or empty")
    return SecretStr(value)


@dataclass(frozen=True)
class SinkRequest:
    """One HTTP POST a sink wants sent."""

    url: SecretStr
    body: bytes = field(repr=False)
    headers: dict[str, str] = field(default_factory=dict)


def _json(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True, default=str).encode()


class AlertSink(ABC):
    """Turns an incident and a status (`firing`/`resolved`) into one HTTP request."""

    def __init__(self, name: str, url: SecretStr, runbook_base: str | None, source: str | None) -> None:
        self.name = name
        self.runbook_base = runbook_base or packaged.runbook_url()
        self.source = source or socket.gethostname()
        self._url = url

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def runbook(self, incident: Incident) -> str:
        """The runbook URL of the incident's fault kind."""
        return runbook_url(self.runbook_base, incident.fault)

    @abstractmethod
    def request(self, incident: Incident, status: str, now: float) -> SinkRequest:
        """Build the request for one attempt at Unix time `now`."""

    def _json_request(self, data: Any) -> SinkRequest:
        return SinkRequest(self._url, _json(data), {"Content-Type": "application/json"})


class WebhookSink(AlertSink):
    """Generic JSON webhook, signed with HMAC-SHA256 when a key is given (see the module docstring)."""

    def __init__(
        self,
        url: SecretStr,
        hmac_key: SecretStr | None = None,
        *,
        name: str = "webhook",
        runbook_base: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(name, url, runbook_base, source)
        self._key = hmac_key

    def request(self, incident: Incident, status: str, now: float) -> SinkRequest:
        body = _json(generic_payload(incident, status, self.runbook(incident), self.source))
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            timestamp = str(int(now))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(self._key.get_secret_value().encode(), timestamp, body)
        return SinkRequest(self._url, body, headers)


class SlackSink(AlertSink):
    """Slack incoming webhook (the URL is the secret); a resolve posts a RESOLVED message."""

    def __init__(
        self,
        url: SecretStr,
        *,
        name: str = "slack",
        runbook_base: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(name, url, runbook_base, source)

    def request(self, incident: Incident, status: str, now: float) -> SinkRequest:
        return self._json_request(slack_payload(incident, status, self.runbook(incident), self.source))


class PagerDutySink(AlertSink):
    """PagerDuty Events API v2: `trigger` on fire, `resolve` on resolve, dedup key = incident id."""

    EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"

    def __init__(
        self,
        routing_key: SecretStr,
        *,
        url: str = EVENTS_URL,
        name: str = "pagerduty",
        runbook_base: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(name, SecretStr(url), runbook_base, source)
        self._key = routing_key

    def request(self, incident: Incident, status: str, now: float) -> SinkRequest:
        key = self._key.get_secret_value()
        return self._json_request(
            pagerduty_payload(incident, status, key, self.runbook(incident), self.source)
        )


class AlertmanagerSink(AlertSink):
    """Pushes into an Alertmanager's `POST /api/v2/alerts`.

    A firing alert carries `endsAt = now + firing_ttl_s` (Alertmanager would otherwise resolve it after its
    `resolve_timeout`); the resolve re-sends the same labels with `endsAt` at the recovery time.
    """

    def __init__(
        self,
        base_url: str,
        *,
        name: str = "alertmanager",
        firing_ttl_s: float = 12 * 3600.0,
        runbook_base: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(name, SecretStr(base_url.rstrip("/") + "/api/v2/alerts"), runbook_base, source)
        self._ttl_s = firing_ttl_s

    def request(self, incident: Incident, status: str, now: float) -> SinkRequest:
        runbook = self.runbook(incident)
        return self._json_request(
            alertmanager_payload(incident, status, runbook, self.source, now, self._ttl_s)
        )
