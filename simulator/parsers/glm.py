"""GLM: the glm45 and glm47 tool-call detectors (`<arg_key>`/`<arg_value>` pairs) and the glm45 reasoning."""

from __future__ import annotations

import json
import re
from typing import Any

from simulator.parsers.base import Call, ToolDetector, Tools, declared, dumps
from simulator.parsers.reasoning import ReasoningFormat

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _value(raw: str, schema: dict[str, Any]) -> Any:
    """A value as its schema types it: strings kept (unquoted), anything else read as JSON when it is."""
    if schema.get("type") == "string":
        return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" else raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _arguments(body: str, name: str, tools: Tools) -> str:
    """The key/value pairs of a call as a JSON object, typed by the declared tool's parameter schema."""
    tool = next((t for t in tools or [] if t.get("function", {}).get("name") == name), {})
    props = (tool.get("function", {}).get("parameters") or {}).get("properties") or {}
    args = {k.strip(): _value(v, props.get(k.strip()) or {}) for k, v in _PAIR.findall(body)}
    return dumps(args)


class _GlmDetector(ToolDetector):
    """`<tool_call>NAME…</tool_call>` blocks; `_call` reads (name, pairs) out of one block."""

    bot = "<tool_call>"
    markers = ("<tool_call>",)
    dropped = ("</tool_call>",)
    hold = "all"
    _call: str

    def _found(self, text: str, tools: Tools) -> list[Call]:
        found: list[Call] = []
        for block in re.findall(r"<tool_call>.*?</tool_call>", text, re.DOTALL):
            m = re.search(self._call, block, re.DOTALL)
            if m is not None:
                found.append((m.group(1) or "", _arguments(m.group(2) or "", m.group(1) or "", tools)))
        return found


class Glm45Detector(_GlmDetector):
    """GLM-4.5: the name, a newline (real or escaped), then the pairs."""

    _call = r"<tool_call>(.*?)(?:\\n|\n)(.*)</tool_call>"

    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """The closed blocks; the text before the first one is the content."""
        return declared(prefix, self._found(text, tools), tools)

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """The name runs to the first newline, even past a `</tool_call>`."""
        calls: list[Call] = []
        pattern = re.compile(r"<tool_call>(.*?)(?:\\n|\n)(.*?)(</tool_call>|$)", re.DOTALL)
        pos = 0
        while (m := pattern.search(section, pos)) is not None and m.group(1).strip():
            name = m.group(1).strip()
            calls.append((name, _arguments(m.group(2), name, tools) if m.group(3) else ""))
            if not m.group(3):
                break
            pos = m.end()
        return calls


class Glm47Detector(_GlmDetector):
    """GLM-4.7: the name, then the pairs with no separator."""

    _call = r"<tool_call>(.*?)(<arg_key>.*?)?</tool_call>"

    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """The closed blocks; the content is all the text outside them."""
        found = self._found(text, tools)
        return declared(re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL), found, tools)

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """A call appears with its first pair; its arguments once it is closed."""
        calls: list[Call] = []
        for block in section.split("<tool_call>")[1:]:
            done = "</tool_call>" in block
            m = re.match(r"(.*?)(<arg_key>.*)?$", block.split("</tool_call>")[0], re.DOTALL)
            if m is None or not (done or m.group(2)):
                break
            name = m.group(1).strip()
            calls.append((name, _arguments(m.group(2) or "", name, tools) if done else ""))
        return calls


GLM45_REASONING = ReasoningFormat("<think>", "</think>", "<tool_call>", "enable_thinking")
