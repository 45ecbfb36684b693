"""Poll to a deadline instead of sleeping: the one synchronisation primitive of the tests."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call `probe` until it returns something truthy and return that; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str, interval: float = 0.01
) -> None:
    """The same inside an event loop: `check` may be a plain or an async predicate."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
