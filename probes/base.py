"""What every probe returns, and the process-tree view the monitor reads.

Nothing here does I/O at import time, so `policies/` may import these types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from aiohttp import ClientResponse

PROBES = (
    "health",
    "canary_tool",
    "canary_reasoning",
    "canary_stream",
    "config_check",
    "progress",
    "ranks",
    "logs",
    "gpu",
    "stacks",
)


@dataclass(frozen=True)
class Observation:
    """A timestamped fact from one probe; a probe that times out or errors gives ok=False, never raises."""

    probe: str  # one of PROBES
    at: float  # monotonic time the observation completed
    ok: bool
    detail: str  # one line for humans
    latency_s: float | None = None
    values: Mapping[str, Any] = field(default_factory=dict)  # probe-specific evidence, JSON-ready


class TreeView(Protocol):
    """The supervised process tree as the monitor needs it (the launcher's snapshot, adapted)."""

    @property
    def main_alive(self) -> bool: ...

    @property
    def missing_ranks(self) -> list[str]: ...

    @property
    def zombie_ranks(self) -> list[str]: ...

    @property
    def rank_cpu_s(self) -> dict[str, float]: ...


async def read_capped(resp: ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of a response body; longer bodies are cut, never buffered whole."""
    return await resp.content.read(limit)
