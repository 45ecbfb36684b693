"""Time, injected: the loop reads the monotonic clock, the wall clock and sleeps only through a `Clock`."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """What the server loop needs of time; tests pass a fake that advances on `sleep`."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines)."""
        ...

    def wall(self) -> float:
        """Unix seconds (display, incident timestamps)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (yielding to the event loop)."""
        ...


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wall(self) -> float:
        """time.time()."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep()."""
        await asyncio.sleep(max(0.0, seconds))
