"""The status endpoint's documents as cached values: rendered when asked for, at most every `period_s`.

A request is answered from the cache, so a client's cost on the loop is a lookup and a write, whatever the
document's size; rendering happens at most once per period however many clients ask. A document that takes long
to render (a large journal, many metric series) is re-rendered less often still: never more than `LOOP_SHARE`
of the loop's time goes to one document, so one taking 10 ms is re-rendered at most every 0.5 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
LOOP_SHARE = 0.02


class Cached(Generic[T]):
    """`render()`'s value, kept for `period_s` (0: rendered on every call) or longer when rendering is slow."""

    def __init__(self, render: Callable[[], T], period_s: float, clock: Callable[[], float] = time.monotonic):
        self.render, self.period_s, self.clock = render, period_s, clock
        self.value: T | None = None
        self.rendered_at = 0.0
        self.hold_s = 0.0

    def get(self) -> T:
        """The cached value, rendered again first when it is older than its hold time (or invalidated)."""
        now = self.clock()
        if self.value is None or now - self.rendered_at >= self.hold_s:
            self.value = self.render()
            self.rendered_at = self.clock()
            took = self.rendered_at - now
            self.hold_s = max(self.period_s, took / LOOP_SHARE) if self.period_s > 0 else 0.0
        return self.value

    def invalidate(self) -> None:
        """The next `get` renders again (after an operator command changed the state)."""
        self.value = None
