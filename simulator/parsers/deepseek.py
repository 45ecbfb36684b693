"""DeepSeek: the deepseekv3 and deepseekv31 tool-call detectors and the deepseek-r1 / deepseek-v3 reasoning."""

from __future__ import annotations

import json
import re

from simulator.parsers.base import Call, ToolDetector, Tools, declared, dumps
from simulator.parsers.reasoning import ReasoningFormat

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"


class _DeepSeekDetector(ToolDetector):
    """Calls between `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`; `_call` is one call's grammar."""

    bot = CALLS_BEGIN
    markers = (CALLS_BEGIN, CALL_BEGIN)
    hold = "none"
    # DeepSeek detectors send a call's name alone and its arguments from the next chunk on; when the
    # stream ends first, the serving layer sends the last call's arguments as "{}".
    deferred_args = True
    _call: str

    def parse(self, text: str, prefix: str, tools: Tools) -> tuple[str, list[Call]]:
        """Every call must match the grammar, or the whole output stays raw text."""
        found: list[Call] = []
        for block in re.findall(rf"{CALL_BEGIN}(.*?){CALL_END}", text, re.DOTALL):
            m = re.match(self._call, block, re.DOTALL)
            if m is None:
                return text, []
            name, args = m.groups()[-2:]
            found.append((name, dumps(json.loads(args))))
        return declared(prefix, found, tools)


class DeepSeekV3Detector(_DeepSeekDetector):
    """`function<｜tool▁sep｜>NAME` then the arguments in a ```json fence."""

    dropped = (CALLS_END, "```", CALL_END)
    _call = r"(.*)<｜tool▁sep｜>(.*)\n```json\n(.*)\n```$"

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """A call appears once its fence is closed."""
        calls: list[Call] = []
        for block in section.split(CALL_BEGIN)[1:]:
            m = re.match(r"(.*)<｜tool▁sep｜>(.*)\n```json\n(.*)\n```", block, re.DOTALL)
            if m is None:
                break
            calls.append((m.group(2).strip(), m.group(3).strip()))
        return calls


class DeepSeekV31Detector(_DeepSeekDetector):
    """`NAME<｜tool▁sep｜>ARGUMENTS`, no fence."""

    dropped = (CALLS_END, CALL_END)
    _call = r"(.*)<｜tool▁sep｜>(.*)$"

    def stream_calls(self, section: str, tools: Tools) -> list[Call]:
        """A call appears once its arguments are valid JSON."""
        calls: list[Call] = []
        blocks = section.split(CALL_BEGIN)[1:]
        for i, block in enumerate(blocks):
            m = re.match(rf"(.*)<｜tool▁sep｜>(.*?)({CALL_END}|$)", block, re.DOTALL)
            if m is None:
                break
            if _is_json(m.group(2)):
                calls.append((m.group(1).strip(), m.group(2).strip()))
                continue
            # A call that never parses stays open: the greedy match then reads the LAST call's text.
            rest = re.match(rf"(.*)<｜tool▁sep｜>(.*?)({CALL_END}|$)", CALL_BEGIN.join(blocks[i:]), re.DOTALL)
            calls.append((m.group(1).strip(), rest.group(2).strip() if rest else ""))
            break
        return calls


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


DEEPSEEK_R1_REASONING = ReasoningFormat("<think>", "</think>", None, "always")
DEEPSEEK_V3_REASONING = ReasoningFormat("<think>", "</think>", "<tool_call>", "explicit_thinking")
