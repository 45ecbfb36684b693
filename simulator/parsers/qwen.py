"""JSON calls in `<tool_call>` tags: the qwen25 and hermes detectors, and the qwen3 reasoning formats."""

from __future__ import annotations

import json
import re

from simulator.parsers.base import Call, ToolDetector, Tools, declared, dumps, tool_names
from simulator.parsers.reasoning import ReasoningFormat


def _json_call(raw: str) -> Call | None:
    """`{"name": ..., "arguments"|"parameters": ...}`; None for JSON that is not an object."""
    obj = json.loads(raw.strip())
    if not isinstance(obj, dict):
        return None
    return str(obj.get("name")), dumps(obj.get("parameters") or obj.get("arguments", {}))


def _stream_json_calls(section: str, tools: Tools) -> list[Call]:
    """The calls so far: each once its declared name is seen, arguments once its JSON is whole."""
    known = tool_names(tools)
    calls: list[Call] = []
    for block in section.split("<tool_call>")[1:]:
        body = block.split("</tool_call>")[0]
        named = re.search(r'"name"\s*:\s*"([^"]*)"', body)
        if named is None or named.group(1) not in known:
            break
        try:
            call = _json_call(body)
        except ValueError:
            calls.append((named.group(1), ""))
            continue
        if call is None:
            break
        calls.append(call)
    return calls


class Qwen25Detector(ToolDetector):
    """`<tool_call>\\n{json}\\n</tool_call>`; a call that does not parse is skipped."""

    bot = "<tool_call>\n"
    markers = ("<tool_call>\n",)
    dropped = ("\n</tool_call>", "</tool_call>")
    hold = "all"

    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """Every well-formed call, in order."""
        found: list[Call] = []
        for raw in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
            try:
                call = _json_call(raw)
            except ValueError:
                continue
            found.extend([call] if call else [])
        return declared(prefix, found, tools)

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """JSON calls as they arrive."""
        return _stream_json_calls(section, tools)


class HermesDetector(ToolDetector):
    """`<tool_call>{json}</tool_call>`, the last one possibly unclosed; a call that does not parse spoils all."""

    bot = "<tool_call>"
    markers = ("<tool_call>",)
    dropped = ("</tool_call>",)
    hold = "tail"
    keep_prefix = True

    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """Every call, closed or running to the end."""
        found: list[Call] = []
        for closed, open_ended in re.findall(
            r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL
        ):
            call = _json_call(closed or open_ended) if (closed or open_ended) else None
            found.extend([call] if call else [])
        return declared(prefix, found, tools)

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """JSON calls as they arrive."""
        return _stream_json_calls(section, tools)


QWEN3_REASONING = ReasoningFormat("<think>", "</think>", "<tool_call>", "enable_thinking")
QWEN3_THINKING_REASONING = ReasoningFormat("<think>", "</think>", "<tool_call>", "always")
