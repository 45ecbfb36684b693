"""structlog: JSON lines to stderr (the journal), a console renderer on a TTY; dotted event names; secrets masked.

When stderr is systemd's journal stream (`$JOURNAL_STREAM` names its device and inode), each line starts with
the sd-daemon(3) priority prefix of its level (`<3>` for an error): journald strips it and records the line's
`PRIORITY=`, so `journalctl -p warning` and `systemctl status` see errors as errors, and `MESSAGE` stays the
JSON object.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

from supervisor.redaction import scrub_event

# sd-daemon(3) / syslog priorities of the structlog levels.
PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def to_journal() -> bool:
    """Whether stderr is the journal stream systemd connected (not a file or pipe it was redirected to)."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(sys.stderr.fileno())
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (OSError, ValueError, AttributeError):
        return False


def with_priority(renderer: structlog.typing.Processor) -> structlog.typing.Processor:
    """`renderer`'s line behind the priority prefix of the event's level."""

    def render(logger: Any, name: str, event: structlog.typing.EventDict) -> str:
        line = renderer(logger, name, event)
        text = line.decode() if isinstance(line, bytes | bytearray) else str(line)
        return f"<{PRIORITIES.get(event.get('level', 'info'), 6)}>{text}"

    return render


def configure(level: str = "info", json_logs: bool | None = None) -> None:
    """Configure structlog once for the process."""
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=False)
    )
    if json_logs and to_journal():
        renderer = with_priority(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            scrub_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        # one write per line (print writes the line and its newline apart): PID 1 and SGLang's launcher may write
        # to the same pipe, and a line split in two could take one of theirs in between
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
