"""The daemon's log lines: JSON, and behind the journal's priority prefix of their level only when stderr is the journal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

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
