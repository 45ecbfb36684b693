"""The daemon's log lines: JSON, and behind the journal's priority prefix of their level only when stderr is the journal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import structlog

from supervisor import pid1
from supervisor.reporting import logsetup


def test_a_line_to_the_journal_carries_its_levels_priority() -> None:
    """An error renders as `<3>{json}`, a warning `<4>`, info `<6>`: journald stores PRIORITY and the JSON."""
    render = logsetup.with_priority(lambda _logger, _name, event: json.dumps(event))
    for level, prefix in (("error", "<3>"), ("warning", "<4>"), ("info", "<6>"), ("debug", "<7>")):
        line = render(None, "", {"event": "x.y", "level": level})
        assert line.startswith(prefix) and json.loads(line[len(prefix) :])["level"] == level


def test_only_the_journal_stream_named_by_systemd_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JOURNAL_STREAM matching stderr's device and inode means the journal; another file, or none, does not."""
    with (tmp_path / "stderr").open("w") as fh:
        monkeypatch.setattr(sys, "stderr", fh)
        st = os.fstat(fh.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert logsetup.to_journal()
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")
        assert not logsetup.to_journal()
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not logsetup.to_journal()


class Writes:
    """A stderr that records every write call (one call per line is what keeps two writers' lines whole)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("not a file")


def test_the_daemon_and_pid_1_write_each_json_line_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container PID 1 and the daemon write to one pipe. A line written as its text and then its newline
    (`print`) can take the other's whole line in between, and then neither parses: each line is one write."""
    fake = Writes()
    monkeypatch.setattr(sys, "stderr", fake)
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    try:
        logsetup.configure("info", json_logs=True)
        structlog.get_logger().info("daemon.line", n=1)
    finally:
        structlog.reset_defaults()
    pid1._log("init.line", n=2)
    assert len(fake.calls) == 2, fake.calls
    for call, event in zip(fake.calls, ("daemon.line", "init.line"), strict=True):
        assert call.endswith("\n") and call.count("\n") == 1 and json.loads(call)["event"] == event
