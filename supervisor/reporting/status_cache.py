"""The status endpoint's documents as cached values: rendered when asked for, at most every `period_s`.

A request is answered from the cache, so a client's cost on the loop is a lookup and a write, whatever the
document's size; rendering happens at most once per period however many clients ask. A document that takes long
to render (a large journal, many metric series) is re-rendered less often still: never more than `LOOP_SHARE`
of the loop's time goes to one document, so one taking 10 ms is re-rendered at most every 0.5 s.

`Cached` renders on the loop (for documents that read the live state); `Threaded` renders in a worker thread, one
render at a time, for documents that read files only (the incident journal: 30 ms for 500 incidents, 370 ms for
5000, measured), so a long render never stalls the loop: the GIL passes back to it every few milliseconds.
"""

from __future__ import annotations

import asyncio
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
            self._keep(self.render(), now)
        assert self.value is not None
        return self.value

    def _keep(self, value: T, started: float) -> None:
        self.value = value
        self.rendered_at = self.clock()
        took = self.rendered_at - started
        self.hold_s = max(self.period_s, took / LOOP_SHARE) if self.period_s > 0 else 0.0

    def invalidate(self) -> None:
        """The next `get` renders again (after an operator command changed the state)."""
        self.value = None


class Threaded(Cached[T]):
    """A `Cached` whose `render` runs in a worker thread; requests meanwhile wait for that one render."""

    def __init__(self, render: Callable[[], T], period_s: float, clock: Callable[[], float] = time.monotonic):
        super().__init__(render, period_s, clock)
        self.rendering: asyncio.Task[bool] | None = None
        self.generation = 0

    async def fetch(self) -> T:
        """The cached value, rendered again first (off the loop) when it is older than its hold time."""
        while True:
            if self.rendering is None:
                if self.value is not None and self.clock() - self.rendered_at < self.hold_s:
                    return self.value
                self.rendering = asyncio.create_task(self._render(self.generation))
            task = self.rendering
            await asyncio.shield(task)
            if task.result() and self.value is not None:
                return self.value

    def invalidate(self) -> None:
        """The next `fetch` renders again, and a render under way is not kept."""
        super().invalidate()
        self.generation += 1

    async def _render(self, generation: int) -> bool:
        """Render in a worker thread; keep the value unless invalidated meanwhile (whether it was kept)."""
        started = self.clock()
        try:
            value = await asyncio.to_thread(self.render)
        finally:
            self.rendering = None
        if generation != self.generation:
            return False
        self._keep(value, started)
        return True
