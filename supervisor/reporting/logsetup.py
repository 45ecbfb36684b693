"""structlog: JSON lines to stderr (the journal), a console renderer on a TTY; dotted event names; secrets masked."""

from __future__ import annotations

import logging
import sys

import structlog

from supervisor.redaction import scrub_event


def configure(level: str = "info", json_logs: bool | None = None) -> None:
    """Configure structlog once for the process."""
    if json_logs is None:
        json_logs = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            scrub_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
