"""Reasoning (think-block) parsing: one format per `--reasoning-parser`, whole output and streamed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.parsers.base import partial_len


@dataclass(frozen=True)
class ReasoningFormat:
    """A reasoning parser's markers, the tool-call token that also ends reasoning, and when it is forced on
    (reasoning from the first token, no start marker needed).

    `forced_when`: "always", "never", "explicit_thinking" (only `thinking: true`), or a chat_template_kwargs
    key that forces it unless set to false.
    """

    start: str
    end: str
    interrupt: str | None
    forced_when: str

    def forced(self, kwargs: dict[str, Any] | None) -> bool:
        """Whether reasoning is on from the first token for these chat_template_kwargs."""
        kw = kwargs or {}
        if self.forced_when == "always":
            return True
        if self.forced_when == "explicit_thinking":
            return kw.get("thinking") is True
        return self.forced_when != "never" and kw.get(self.forced_when) is not False

    def split(self, text: str, forced: bool) -> tuple[str | None, str]:
        """Whole output: (reasoning or None, the rest)."""
        if not (forced or self.start in text):
            return None, text
        body = text
        while body.startswith(self.start):
            body = body[len(self.start) :]
        if self.end in body:
            reasoning, content = body.split(self.end, 1)
            return reasoning, content
        cut = body.find(self.interrupt) if self.interrupt else -1
        if cut != -1:
            return body[:cut], body[cut:]
        return body, ""

    def stream(self, forced: bool) -> ReasoningStream:
        """A streaming parse of one choice."""
        return ReasoningStream(self, forced)


class ReasoningStream:
    """Streamed output split into (reasoning, normal) pieces, holding back what may start a marker."""

    def __init__(self, fmt: ReasoningFormat, forced: bool) -> None:
        self.start, self.end, self.interrupt = fmt.start, fmt.end, fmt.interrupt
        self.inside = forced
        self.stripped = False
        self.buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, normal text) to emit for one chunk."""
        current = self.buffer + text
        self.buffer = current
        watch = (self.start, self.end, *((self.interrupt,) if self.interrupt else ()))
        if any(t.startswith(current) and t != current for t in watch):
            return "", ""
        if not self.stripped and self.start in current:
            current = self.buffer = current.replace(self.start, "", 1)
            self.stripped = self.inside = True
        if not self.inside:
            self.buffer = ""
            return "", current
        for token in (self.end, self.interrupt):
            at = current.find(token) if token else -1
            if at != -1:
                self.buffer, self.inside = "", False
                rest = current[at + len(self.end) :] if token == self.end else current[at:]
                return current[:at], rest
        hold = partial_len(current, watch)
        self.buffer = current[len(current) - hold :]
        return current[: len(current) - hold], ""

    def finish(self) -> tuple[str, str]:
        """What was held back, once generation ends."""
        left, self.buffer = self.buffer, ""
        if not self.inside:
            return "", left
        return (left[len(self.start) :] if left.startswith(self.start) else left), ""
