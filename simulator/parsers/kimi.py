"""Kimi: the kimi_k2 tool-call detector and the kimi_k2 / kimi reasoning formats."""

from __future__ import annotations

import re

from simulator.parsers.base import Call, ToolDetector, Tools
from simulator.parsers.reasoning import ReasoningFormat

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
_ID = re.compile(r"^(?:functions\.)?([\w.\-]+):(\d+)$")
_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*([^\s<|]+)\s*<\|tool_call_argument_begin\|>\s*(.*?)\s*(<\|tool_call_end\|>|$)",
    re.DOTALL,
)


class KimiK2Detector(ToolDetector):
    """`functions.NAME:INDEX` calls in a tool-calls section; ids kept as the model wrote them."""

    bot = SECTION_BEGIN
    markers = (SECTION_BEGIN, CALL_BEGIN)
    dropped = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END, ARGUMENT_BEGIN)
    hold = "tail"
    keep_prefix = True

    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """Only closed calls with an object argument; undeclared names are kept and the text is not stripped."""
        found: list[Call] = []
        for ident, args, end in _CALL.findall(text):
            m = _ID.match(ident)
            if m and end and args.startswith("{") and args.endswith("}"):
                found.append((m.group(1), args))
        return prefix, found

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """Every call with a well-formed id so far, its arguments as far as they have come."""
        calls: list[Call] = []
        for ident, args, _ in _CALL.findall(section):
            m = _ID.match(ident)
            if m is None:
                break
            calls.append((m.group(1), args))
        return calls

    def call_id(self, name: str, index: int, context: str) -> str:
        """Kimi's own id shape."""
        return f"functions.{name}:{index}"


KIMI_K2_REASONING = ReasoningFormat("<think>", "</think>", SECTION_BEGIN, "thinking")
KIMI_REASONING = ReasoningFormat("◁think▷", "◁/think▷", None, "never")
