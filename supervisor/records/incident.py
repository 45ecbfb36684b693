"""The incident record: one fault of one server, from detection to recovery."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from policies.argv import redact as redact_argv
from supervisor.redaction import hide


@dataclass(frozen=True)
class Incident:
    """What happened to a server, what was done, and what it cost.

    `detected_at` and `recovered_at` are wall-clock Unix seconds (for display and alerts);
    `detection_latency_s` and `time_to_serving_s` are measured on the monotonic clock.
    """

    id: str
    server: str
    fault: str
    detected_at: float
    evidence: dict[str, Any] = field(default_factory=dict)
    action: str = ""
    reason: str = ""
    severity: str = "page"
    argv_before: tuple[str, ...] = ()
    argv_after: tuple[str, ...] = ()
    flags_added: tuple[str, ...] = ()
    flags_removed: tuple[str, ...] = ()
    rung: int = 0
    forensics_path: str = ""
    recovered_at: float | None = None
    detection_latency_s: float | None = None
    time_to_serving_s: float | None = None
    actor: str = "supervisor"

    @property
    def resolved(self) -> bool:
        """True once the server is serving again after this incident."""
        return self.recovered_at is not None

    def resolve(self, recovered_at: float, time_to_serving_s: float | None) -> Incident:
        """Return a copy marked recovered."""
        return replace(self, recovered_at=recovered_at, time_to_serving_s=time_to_serving_s)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists); API keys in argv and every known secret masked."""
        data = asdict(self)
        for key in ("argv_before", "argv_after", "flags_added", "flags_removed"):
            data[key] = redact_argv(data[key])
        shown = hide(data)
        assert isinstance(shown, dict)
        return shown

    def redacted(self) -> Incident:
        """A copy as it may leave the daemon (alerts): argv keys and every known secret masked."""
        return Incident.from_json(self.to_json())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Incident:
        """Inverse of `to_json`; unknown keys are ignored so old journals stay readable."""
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("argv_before", "argv_after", "flags_added", "flags_removed"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)
