"""The serving layer: a chat completion's raw output through the configured parsers, whole or streamed."""

from __future__ import annotations

from typing import Any

from simulator.parsers.base import ParsedMessage, ToolCall, ToolDetector, Tools, partial_len
from simulator.parsers.registry import reasoning_format, tool_detector


def _tools_active(detector: ToolDetector | None, tools: Tools, tool_choice: Any) -> ToolDetector | None:
    """The detector, when the request lets it parse (tools declared, tool_choice not "none")."""
    return detector if detector is not None and tools and tool_choice != "none" else None


def parse_complete(
    text: str,
    *,
    tool_parser: str | None,
    reasoning_parser: str | None,
    tools: Tools,
    tool_choice: Any,
    raw_finish_reason: str,
    chat_template_kwargs: dict[str, Any] | None,
) -> ParsedMessage:
    """Parse a whole raw output as SGLang's non-streaming chat path does."""
    reasoning: str | None = None
    fmt = reasoning_format(reasoning_parser)
    if fmt is not None:
        reasoning, text = fmt.split(text, fmt.forced(chat_template_kwargs))
    finish = raw_finish_reason
    calls: list[ToolCall] = []
    detector = _tools_active(tool_detector(tool_parser), tools, tool_choice)
    if detector is not None and detector.bot in text:
        normal, found = detector.detect_and_parse(text, tools)
        calls = [ToolCall(detector.call_id(n, i, text), i, n, a) for i, (n, a) in enumerate(found)]
        text = normal
        if calls and finish == "stop":
            finish = "tool_calls"
    return ParsedMessage(text, reasoning or None, calls, finish)


class StreamParser:
    """Incremental parsing of one streamed choice into OpenAI `delta` dicts."""

    def __init__(
        self,
        *,
        tool_parser: str | None,
        reasoning_parser: str | None,
        tools: Tools,
        tool_choice: Any,
        chat_template_kwargs: dict[str, Any] | None,
    ) -> None:
        fmt = reasoning_format(reasoning_parser)
        self._reasoning = fmt.stream(fmt.forced(chat_template_kwargs)) if fmt is not None else None
        self._detector = _tools_active(tool_detector(tool_parser), tools, tool_choice)
        self._tools = tools
        self._text = ""
        self._flushed = 0
        self._section = -1
        self._sent: list[tuple[str, str]] = []

    def feed(self, delta_text: str) -> list[dict[str, Any]]:
        """The deltas to emit for one chunk of raw output."""
        reasoning, normal = self._reasoning.feed(delta_text) if self._reasoning else ("", delta_text)
        out: list[dict[str, Any]] = [{"reasoning_content": reasoning}] if reasoning else []
        return out + self._tool_deltas(normal, final=False)

    def finish(self, raw_finish_reason: str) -> tuple[list[dict[str, Any]], str]:
        """Trailing deltas once generation ends, and the finish_reason to report."""
        reasoning, normal = self._reasoning.finish() if self._reasoning else ("", "")
        out: list[dict[str, Any]] = [{"reasoning_content": reasoning}] if reasoning else []
        out += self._tool_deltas(normal, final=True)
        finish = "tool_calls" if self._sent and raw_finish_reason == "stop" else raw_finish_reason
        return out, finish

    def _content(self, upto: int) -> list[dict[str, Any]]:
        piece = self._text[self._flushed : upto]
        self._flushed = upto
        for token in self._detector.dropped if self._detector else ():
            piece = piece.replace(token, "")
        return [{"content": piece}] if piece else []

    def _tool_deltas(self, text: str, *, final: bool) -> list[dict[str, Any]]:
        detector = self._detector
        if detector is None:
            return [{"content": text}] if text else []
        self._text += text
        if self._section < 0:
            found = [i for i in (self._text.find(m, self._flushed) for m in detector.markers) if i != -1]
            if not found:
                partial = partial_len(self._text, detector.markers)
                if final or detector.hold == "none" or not partial:
                    return self._content(len(self._text))
                return self._content(len(self._text) - partial) if detector.hold == "tail" else []
            self._section = min(found)
            if not detector.keep_prefix:
                self._flushed = self._section
            out = self._content(self._section)
        else:
            out = []
        return out + self._call_deltas(detector, final)

    def _call_deltas(self, detector: ToolDetector, final: bool) -> list[dict[str, Any]]:
        deferred = detector.deferred_args
        out: list[dict[str, Any]] = []
        calls = detector.stream_calls(self._text[self._section :], self._tools)
        for index, (name, args) in enumerate(calls):
            fresh = index == len(self._sent)
            if fresh:
                self._sent.append((name, ""))
                out.append(_tool_delta(index, detector.call_id(name, index, self._text), name, ""))
            if deferred and (fresh or final):
                if final and index == len(calls) - 1 and not self._sent[index][1]:
                    out.append(_tool_delta(index, None, None, "{}"))
                    self._sent[index] = (name, "{}")
                continue
            sent = self._sent[index][1]
            if args.startswith(sent) and args != sent:
                out.append(_tool_delta(index, None, None, args[len(sent) :]))
                self._sent[index] = (name, args)
            elif deferred and args and not args.startswith(sent):
                out.append(_tool_delta(index, None, None, args))
                self._sent[index] = (name, sent + args)
        return out


def _tool_delta(index: int, ident: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    call = {
        "index": index,
        "id": ident,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"tool_calls": [call]}


def chunk_tokens(tokens: list[str], stream_interval: int) -> list[str]:
    """The text of each stream chunk when `stream_interval` tokens are sent together."""
    step = max(1, stream_interval)
    return ["".join(tokens[i : i + step]) for i in range(0, len(tokens), step)]
