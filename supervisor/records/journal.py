"""The incident journal: `state_dir/incidents.jsonl`, one JSON object per line, append-only.

Each `append` writes one line and fsyncs it before returning, so an incident survives a crash of the daemon
or the host. An update of an incident (e.g. recovered) is appended as a new line with the same id; on read
the latest line of an id wins and the incident keeps the position of its first line. A torn last line
(the daemon died mid-write) is skipped on read and fenced off with a newline before the next append.
The calls are synchronous and short; the daemon may run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

from supervisor.records.incident import Incident

log = structlog.get_logger("supervisor.records.journal")


class IncidentJournal:
    """Append-only JSON-lines store of incidents."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, incident: Incident) -> None:
        """Write the incident as one line and fsync it (and the directory when the file is new)."""
        line = json.dumps(incident.to_json(), separators=(",", ":"), default=str).encode() + b"\n"
        created = not self.path.exists()
        if created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+b") as f:
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = b"\n" + line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if created:
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def load(self) -> list[Incident]:
        """Every incident, latest version of each id, in order of first appearance."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        incidents: dict[str, Incident] = {}
        lines = raw.split(b"\n")
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                incident = Incident.from_json(json.loads(line))
            except (ValueError, TypeError, AttributeError):
                if number != len(lines):
                    log.warning("journal.line_skipped", path=str(self.path), line=number)
                continue
            incidents[incident.id] = incident
        return list(incidents.values())

    def page(self, offset: int, limit: int, newest_first: bool = True) -> list[Incident]:
        """A slice of `load()`: `limit` incidents from `offset`, newest first unless told otherwise."""
        if offset < 0 or limit < 0:
            raise ValueError(f"offset and limit must be >= 0, got offset={offset} limit={limit}")
        incidents = self.load()
        if newest_first:
            incidents.reverse()
        return incidents[offset : offset + limit]
