"""What every tool-call detector shares: the parsed shapes, small helpers and the detector base class."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

Tools = list[dict[str, Any]] | None
Call = tuple[str, str]  # (function name, arguments as a JSON string, possibly partial while streaming)


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call; `arguments` is a JSON string."""

    id: str
    index: int
    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedMessage:
    """The assistant message after parsing, and the finish reason to report."""

    content: str | None
    reasoning_content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str


def tool_names(tools: Tools) -> set[str]:
    """The function names the request declares."""
    return {str(t.get("function", {}).get("name")) for t in tools or []}


def declared(normal: str, found: list[Call], tools: Tools) -> tuple[str, list[Call]]:
    """The normal text stripped, and only the calls to functions the request declares."""
    known = tool_names(tools)
    return normal.strip(), [c for c in found if c[0] in known]


def dumps(value: Any) -> str:
    """JSON as the detectors write arguments (non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def partial_len(text: str, tokens: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a strict prefix of one of `tokens`."""
    for size in range(min(len(text), max((len(t) for t in tokens), default=1) - 1), 0, -1):
        if any(t.startswith(text[-size:]) and t != text[-size:] for t in tokens):
            return size
    return 0


class ToolDetector(ABC):
    """One family's tool-call grammar: the whole output (`detect_and_parse`) and a stream (`stream_calls`).

    The class attributes drive the generic streaming of `chat.StreamParser`.
    """

    bot: str  # the marker that makes has_tool_call true
    markers: tuple[str, ...]  # markers that start the tool section while streaming
    dropped: tuple[str, ...]  # tokens removed from streamed content
    hold: Literal["tail", "none", "all"]  # what is held back while a marker may be starting
    keep_prefix: bool = False  # whether text before the marker, held back, is still sent when it arrives
    deferred_args: bool = False  # a call's name is sent alone, its arguments from the next chunk on

    def detect_and_parse(self, text: str, tools: Tools) -> tuple[str, list[Call]]:
        """Non-stream parse of text that holds `bot`: (normal text, [(name, arguments)]); the raw text and
        no calls when the markup does not parse."""
        try:
            return self.parse(text, text[: text.find(self.bot)], tools)
        except (ValueError, AttributeError):
            return text, []

    @abstractmethod
    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """The family's whole-output grammar; `prefix` is the text before `bot`. May raise ValueError."""

    @abstractmethod
    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """The family's streaming grammar: the calls visible so far in a streamed tool section."""

    def call_id(self, name: str, index: int, context: str) -> str:
        """The id of a call: a digest of the output, stable for the same output."""
        digest = hashlib.sha256(f"{context}\x00{index}\x00{name}".encode()).hexdigest()
        return "call_" + digest[:24]
