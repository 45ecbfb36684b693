"""The observation window as the diagnosis reads it: per probe, in time order, with log hits and progress."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.model import Observation, logs_values, progress_values


class Window:
    """Observations grouped by probe, oldest first."""

    def __init__(self, observations: Sequence[Observation]) -> None:
        self.by_probe: dict[str, list[Observation]] = {}
        for obs in sorted(observations, key=lambda o: o.at):
            self.by_probe.setdefault(obs.probe, []).append(obs)

    def all(self, probe: str) -> list[Observation]:
        return self.by_probe.get(probe, [])

    def latest(self, probe: str) -> Observation | None:
        found = self.by_probe.get(probe)
        return found[-1] if found else None

    def hits(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [
            (o.at, dict(h))
            for o in self.all("logs")
            for h in logs_values(o).get("hits", ())
            if h.get("kind") == kind
        ]

    def last_progress_at(self) -> float | None:
        progress, logs = self.latest("progress"), self.latest("logs")
        times = [
            progress_values(progress).get("last_progress_at") if progress else None,
            logs_values(logs).get("last_progress_at") if logs else None,
        ]
        known = [float(t) for t in times if t is not None]
        return max(known) if known else None
