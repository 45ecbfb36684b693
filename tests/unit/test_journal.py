"""The incident journal: append with fsync, latest version wins, torn last line tolerated."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.records.incident import Incident
from supervisor.records.journal import IncidentJournal


def make(n: int, server: str = "decode") -> Incident:
    """Incident number n, detected at second n."""
    return Incident(id=f"inc-{n}", server=server, fault="decode_wedge", detected_at=1_780_000_000.0 + n)


def test_load_of_missing_file_is_empty(tmp_path: Path) -> None:
    """A journal that was never written reads as no incidents."""
    assert IncidentJournal(tmp_path / "incidents.jsonl").load() == []


def test_append_writes_one_line_and_round_trips(tmp_path: Path) -> None:
    """Each append adds exactly one JSON line; load returns equal incidents in order."""
    path = tmp_path / "state" / "incidents.jsonl"
    journal = IncidentJournal(path)
    incidents = [make(1), make(2, "prefill")]
    for incident in incidents:
        journal.append(incident)
    assert path.read_bytes().count(b"\n") == 2
    assert journal.load() == incidents


def test_later_update_of_same_id_wins(tmp_path: Path) -> None:
    """An appended update replaces the earlier version and keeps the first position."""
    journal = IncidentJournal(tmp_path / "incidents.jsonl")
    first, second = make(1), make(2)
    journal.append(first)
    journal.append(second)
    resolved = first.resolve(recovered_at=first.detected_at + 30, time_to_serving_s=28.5)
    journal.append(resolved)
    assert journal.load() == [resolved, second]


def test_torn_last_line_is_skipped_and_fenced(tmp_path: Path) -> None:
    """A half-written last line is ignored on read and does not corrupt the next append."""
    path = tmp_path / "incidents.jsonl"
    journal = IncidentJournal(path)
    journal.append(make(1))
    with path.open("ab") as f:
        f.write(b'{"id": "inc-2", "server": "dec')
    assert journal.load() == [make(1)]
    journal.append(make(3))
    assert journal.load() == [make(1), make(3)]


def test_page_is_newest_first_by_default(tmp_path: Path) -> None:
    """page() slices newest first, or oldest first when asked."""
    journal = IncidentJournal(tmp_path / "incidents.jsonl")
    for n in range(5):
        journal.append(make(n))
    assert [i.id for i in journal.page(0, 2)] == ["inc-4", "inc-3"]
    assert [i.id for i in journal.page(2, 2)] == ["inc-2", "inc-1"]
    assert [i.id for i in journal.page(4, 10)] == ["inc-0"]
    assert [i.id for i in journal.page(1, 2, newest_first=False)] == ["inc-1", "inc-2"]
    assert journal.page(10, 2) == []


def test_page_rejects_negative_bounds(tmp_path: Path) -> None:
    """Negative offset or limit is an error, not a surprising slice."""
    with pytest.raises(ValueError, match="offset"):
        IncidentJournal(tmp_path / "incidents.jsonl").page(-1, 5)
