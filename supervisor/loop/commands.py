"""What reaches a server loop from outside (operator commands) and why watching one launch ended."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from policies.decide import Next
from policies.model import Fault
from policies.triage import Promotion


@dataclass(frozen=True)
class RungChange:
    """An operator's ladder change: `ladder` to `level` (None: every active ladder back to 0), then a planned
    restart when `restart`, else at the next launch."""

    ladder: str | None
    level: int
    restart: bool = False


@dataclass
class Command:
    """An action queued for one server: restart, pause, resume, stop, an operator's rung change, or a
    promote-back the loop itself queued."""

    kind: str  # "restart" | "pause" | "resume" | "stop" | "promote" | "rung"
    reason: str = ""
    actor: str = "operator"
    done: asyncio.Future[str] | None = field(default=None, repr=False)
    promotion: Promotion | None = None  # a promote: the levels decided by policies.triage.promotion
    rung: RungChange | None = None  # a rung: the ladder level the operator chose

    def answer(self, result: str) -> None:
        """Tell the caller waiting on `done` (once)."""
        if self.done is not None and not self.done.done():
            self.done.set_result(result)


@dataclass(frozen=True)
class Outcome:
    """Why watching a launch ended: a fault with the step decided for it, or a command to carry out."""

    fault: Fault | None = None
    decided: Next | None = None
    command: Command | None = None
