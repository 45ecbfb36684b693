"""A generation request as the simulated scheduler sees it, and where its tokens go."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Sink = Callable[[list[str], bool, str], None]  # (new tokens, finished, finish_reason)


@dataclass
class Req:
    """One generation request as the scheduler sees it."""

    rid: str
    tokens: list[str]
    prompt_tokens: int
    finish_reason: str
    sink: Sink
    kind: str = "user"  # "user" | "health" | "warmup"
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    pos: int = 0
    last_token_at: float = 0.0
    stuck: str = ""  # request_stuck: "stuck" (never a token; an abort ends it), "unabortable" (nor that)
