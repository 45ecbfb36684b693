"""Server-side tool-call and reasoning parsing of the simulator, shaped like SGLang's.

Own code, written to reproduce what SGLang 0.5.23 returns for each parser, including when the
parser does not match the model's markup: missing or foreign markers pass through as content,
same-family mismatches give the shapes the real 0.5.23 parsers produce (e.g. deepseekv3 on V3.1 output:
no calls, finish_reason stop, raw content; streaming swallows it). Newer SGLang `main` answers
`tool_calls: []` with finish_reason `tool_calls` there (parsers.md §4); the real-tier tests pin 0.5.23.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

_DS_BOT = "<｜tool▁calls▁begin｜>"
_DS_CALL = "<｜tool▁call▁begin｜>"
_DS_END = "<｜tool▁call▁end｜>"
_KIMI = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
)
_KIMI_ID = re.compile(r"^(?:functions\.)?([\w.\-]+):(\d+)$")
_KIMI_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*([^\s<|]+)\s*<\|tool_call_argument_begin\|>\s*(.*?)\s*(<\|tool_call_end\|>|$)",
    re.DOTALL,
)
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>(?:\\n|\s)*<arg_value>(.*?)</arg_value>", re.DOTALL)

# tool parser -> (marker that makes has_tool_call true, markers that start a call while streaming,
#                 tokens dropped from streamed content, hold-back policy, prefix kept when the marker arrives)
_TOOL: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], str, bool]] = {
    "kimi_k2": (_KIMI[0], (_KIMI[0], _KIMI[2]), _KIMI, "tail", True),
    "deepseekv3": (_DS_BOT, (_DS_BOT, _DS_CALL), ("<｜tool▁calls▁end｜>", "```", _DS_END), "none", False),
    "deepseekv31": (_DS_BOT, (_DS_BOT, _DS_CALL), ("<｜tool▁calls▁end｜>", _DS_END), "none", False),
    "qwen25": ("<tool_call>\n", ("<tool_call>\n",), ("\n</tool_call>", "</tool_call>"), "all", False),
    "hermes": ("<tool_call>", ("<tool_call>",), ("</tool_call>",), "tail", True),
    "glm45": ("<tool_call>", ("<tool_call>",), ("</tool_call>",), "all", False),
    "glm47": ("<tool_call>", ("<tool_call>",), ("</tool_call>",), "all", False),
}
_TOOL["qwen"] = _TOOL["qwen25"]
_TOOL["glm"] = _TOOL["glm45"]

# reasoning parser -> (start, end, tool-start token that also ends reasoning, when it is forced on)
_REASONING: dict[str, tuple[str, str, str | None, str]] = {
    "kimi_k2": ("<think>", "</think>", _KIMI[0], "thinking"),
    "deepseek-r1": ("<think>", "</think>", None, "always"),
    "deepseek-v3": ("<think>", "</think>", "<tool_call>", "explicit_thinking"),
    "qwen3": ("<think>", "</think>", "<tool_call>", "enable_thinking"),
    "qwen3-thinking": ("<think>", "</think>", "<tool_call>", "always"),
    "glm45": ("<think>", "</think>", "<tool_call>", "enable_thinking"),
    "kimi": ("◁think▷", "◁/think▷", None, "never"),
}


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


def _forced(parser: str, kwargs: dict[str, Any] | None) -> bool:
    mode = _REASONING[parser][3]
    kw = kwargs or {}
    if mode == "always":
        return True
    if mode == "explicit_thinking":
        return kw.get("thinking") is True
    return mode != "never" and kw.get(mode) is not False


def _tools_active(parser: str | None, tools: list[dict[str, Any]] | None, tool_choice: Any) -> bool:
    return bool(parser and tools and tool_choice != "none")


def _names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {str(t.get("function", {}).get("name")) for t in tools or []}


def _call_id(parser: str, name: str, index: int, context: str) -> str:
    if parser == "kimi_k2":
        return f"functions.{name}:{index}"
    digest = hashlib.sha256(f"{context}\x00{index}\x00{name}".encode()).hexdigest()
    return "call_" + digest[:24]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _glm_value(raw: str, schema: dict[str, Any]) -> Any:
    if schema.get("type") == "string":
        return raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'" else raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _glm_args(body: str, name: str, tools: list[dict[str, Any]] | None) -> str:
    tool = next((t for t in tools or [] if t.get("function", {}).get("name") == name), {})
    props = (tool.get("function", {}).get("parameters") or {}).get("properties") or {}
    args = {k.strip(): _glm_value(v, props.get(k.strip()) or {}) for k, v in _GLM_PAIR.findall(body)}
    return _dumps(args)


def _json_call(raw: str) -> tuple[str, str] | None:
    obj = json.loads(raw.strip())
    if not isinstance(obj, dict):
        return None
    return str(obj.get("name")), _dumps(obj.get("parameters") or obj.get("arguments", {}))


def _extract(parser: str, text: str, tools: list[dict[str, Any]] | None) -> tuple[str, list[tuple[str, str]]]:
    """Non-stream parse of text that holds the parser's marker: (normal text, [(name, arguments)])."""
    prefix = text[: text.find(_TOOL[parser][0])]
    found: list[tuple[str, str]] = []
    try:
        if parser == "kimi_k2":
            for ident, args, end in _KIMI_CALL.findall(text):
                m = _KIMI_ID.match(ident)
                if m and end and args.startswith("{") and args.endswith("}"):
                    found.append((m.group(1), args))
            return prefix, found
        if parser in ("deepseekv3", "deepseekv31"):
            detail = (
                r"(.*)<｜tool▁sep｜>(.*)\n```json\n(.*)\n```$"
                if parser == "deepseekv3"
                else r"(.*)<｜tool▁sep｜>(.*)$"
            )
            for block in re.findall(rf"{_DS_CALL}(.*?){_DS_END}", text, re.DOTALL):
                m = re.match(detail, block, re.DOTALL)
                if m is None:
                    return text, []
                name, args = m.groups()[-2:]
                found.append((name, _dumps(json.loads(args))))
        elif parser in ("qwen25", "qwen"):
            for raw in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
                try:
                    call = _json_call(raw)
                except ValueError:
                    continue
                found.extend([call] if call else [])
        elif parser == "hermes":
            for closed, open_ended in re.findall(
                r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL
            ):
                call = _json_call(closed or open_ended) if (closed or open_ended) else None
                found.extend([call] if call else [])
        else:
            found = _extract_glm(parser, text, tools)
            if parser == "glm47":
                prefix = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL)
    except (ValueError, AttributeError):
        return text, []
    known = _names(tools)
    return prefix.strip(), [c for c in found if c[0] in known]


def _extract_glm(parser: str, text: str, tools: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    detail = (
        r"<tool_call>(.*?)(?:\\n|\n)(.*)</tool_call>"
        if parser != "glm47"
        else r"<tool_call>(.*?)(<arg_key>.*?)?</tool_call>"
    )
    found = []
    for block in re.findall(r"<tool_call>.*?</tool_call>", text, re.DOTALL):
        m = re.search(detail, block, re.DOTALL)
        if m is not None:
            found.append((m.group(1) or "", _glm_args(m.group(2) or "", m.group(1) or "", tools)))
    return found


def _split_reasoning(text: str, parser: str, forced: bool) -> tuple[str | None, str]:
    start, end, interrupt, _ = _REASONING[parser]
    if not (forced or start in text):
        return None, text
    body = text
    while body.startswith(start):
        body = body[len(start) :]
    if end in body:
        reasoning, content = body.split(end, 1)
        return reasoning, content
    cut = body.find(interrupt) if interrupt else -1
    if cut != -1:
        return body[:cut], body[cut:]
    return body, ""


def parse_complete(
    text: str,
    *,
    tool_parser: str | None,
    reasoning_parser: str | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    raw_finish_reason: str,
    chat_template_kwargs: dict[str, Any] | None,
) -> ParsedMessage:
    """Parse a whole raw output as SGLang's non-streaming chat path does."""
    reasoning: str | None = None
    if reasoning_parser in _REASONING:
        reasoning, text = _split_reasoning(
            text, reasoning_parser, _forced(reasoning_parser, chat_template_kwargs)
        )
    finish = raw_finish_reason
    calls: list[ToolCall] = []
    if (
        tool_parser in _TOOL
        and _tools_active(tool_parser, tools, tool_choice)
        and _TOOL[tool_parser][0] in text
    ):
        normal, found = _extract(tool_parser, text, tools)
        calls = [ToolCall(_call_id(tool_parser, n, i, text), i, n, a) for i, (n, a) in enumerate(found)]
        text = normal
        if calls and finish == "stop":
            finish = "tool_calls"
    return ParsedMessage(text, reasoning or None, calls, finish)


def _partial_len(text: str, tokens: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a strict prefix of one of `tokens`."""
    for size in range(min(len(text), max((len(t) for t in tokens), default=1) - 1), 0, -1):
        if any(t.startswith(text[-size:]) and t != text[-size:] for t in tokens):
            return size
    return 0


class _ReasoningStream:
    def __init__(self, parser: str, forced: bool) -> None:
        self.start, self.end, self.interrupt, _ = _REASONING[parser]
        self.inside = forced
        self.stripped = False
        self.buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
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
        hold = _partial_len(current, watch)
        self.buffer = current[len(current) - hold :]
        return current[: len(current) - hold], ""

    def finish(self) -> tuple[str, str]:
        left, self.buffer = self.buffer, ""
        if not self.inside:
            return "", left
        return (left[len(self.start) :] if left.startswith(self.start) else left), ""


class StreamParser:
    """Incremental parsing of one streamed choice into OpenAI `delta` dicts."""

    def __init__(
        self,
        *,
        tool_parser: str | None,
        reasoning_parser: str | None,
        tools: list[dict[str, Any]] | None,
        tool_choice: Any,
        chat_template_kwargs: dict[str, Any] | None,
    ) -> None:
        self._reasoning = None
        if reasoning_parser in _REASONING:
            self._reasoning = _ReasoningStream(
                reasoning_parser, _forced(reasoning_parser, chat_template_kwargs)
            )
        active = tool_parser in _TOOL and _tools_active(tool_parser, tools, tool_choice)
        self._parser = tool_parser if active and tool_parser else None
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
        for token in _TOOL[self._parser][2] if self._parser else ():
            piece = piece.replace(token, "")
        return [{"content": piece}] if piece else []

    def _tool_deltas(self, text: str, *, final: bool) -> list[dict[str, Any]]:
        if self._parser is None:
            return [{"content": text}] if text else []
        self._text += text
        _, markers, _, hold, keep_prefix = _TOOL[self._parser]
        if self._section < 0:
            found = [i for i in (self._text.find(m, self._flushed) for m in markers) if i != -1]
            if not found:
                partial = _partial_len(self._text, markers)
                if final or hold == "none" or not partial:
                    return self._content(len(self._text))
                return self._content(len(self._text) - partial) if hold == "tail" else []
            self._section = min(found)
            if not keep_prefix:
                self._flushed = self._section
            out = self._content(self._section)
        else:
            out = []
        return out + self._call_deltas(final)

    def _call_deltas(self, final: bool) -> list[dict[str, Any]]:
        assert self._parser is not None
        # DeepSeek detectors send a call's name alone and its arguments from the next chunk on; when the
        # stream ends first, the serving layer sends the last call's arguments as "{}".
        deferred = self._parser in ("deepseekv3", "deepseekv31")
        out: list[dict[str, Any]] = []
        calls = _stream_calls(self._parser, self._text[self._section :], self._tools)
        for index, (name, args) in enumerate(calls):
            fresh = index == len(self._sent)
            if fresh:
                self._sent.append((name, ""))
                out.append(_tool_delta(index, _call_id(self._parser, name, index, self._text), name, ""))
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


def _stream_calls(parser: str, section: str, tools: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    """The calls visible so far in a streamed tool section: (name, arguments so far, complete)."""
    known = _names(tools)
    calls: list[tuple[str, str]] = []
    if parser == "kimi_k2":
        for ident, args, _ in _KIMI_CALL.findall(section):
            m = _KIMI_ID.match(ident)
            if m is None:
                break
            calls.append((m.group(1), args))
        return calls
    if parser in ("deepseekv3", "deepseekv31"):
        blocks = section.split(_DS_CALL)[1:]
        for i, block in enumerate(blocks):
            if parser == "deepseekv3":
                m = re.match(r"(.*)<｜tool▁sep｜>(.*)\n```json\n(.*)\n```", block, re.DOTALL)
                if m is None:
                    break
                calls.append((m.group(2).strip(), m.group(3).strip()))
                continue
            m = re.match(rf"(.*)<｜tool▁sep｜>(.*?)({_DS_END}|$)", block, re.DOTALL)
            if m is None:
                break
            if _is_json(m.group(2)):
                calls.append((m.group(1).strip(), m.group(2).strip()))
                continue
            # A call that never parses stays open: the greedy match then reads the LAST call's text.
            rest = re.match(rf"(.*)<｜tool▁sep｜>(.*?)({_DS_END}|$)", _DS_CALL.join(blocks[i:]), re.DOTALL)
            calls.append((m.group(1).strip(), rest.group(2).strip() if rest else ""))
            break
        return calls
    if parser in ("glm45", "glm"):
        return _glm45_calls(section, tools)
    for block in section.split("<tool_call>")[1:]:
        call = _stream_block(parser, block, known, tools)
        if call is None:
            break
        calls.append(call)
    return calls


def _glm45_calls(section: str, tools: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    """GLM-4.5 streaming: the name runs to the first newline, even past a `</tool_call>`."""
    calls: list[tuple[str, str]] = []
    pattern = re.compile(r"<tool_call>(.*?)(?:\\n|\n)(.*?)(</tool_call>|$)", re.DOTALL)
    pos = 0
    while (m := pattern.search(section, pos)) is not None and m.group(1).strip():
        name = m.group(1).strip()
        calls.append((name, _glm_args(m.group(2), name, tools) if m.group(3) else ""))
        if not m.group(3):
            break
        pos = m.end()
    return calls


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _stream_block(
    parser: str, block: str, known: set[str], tools: list[dict[str, Any]] | None
) -> tuple[str, str] | None:
    done = "</tool_call>" in block
    body = block.split("</tool_call>")[0]
    if parser == "glm47":
        m = re.match(r"(.*?)(<arg_key>.*)?$", body, re.DOTALL)
        if m is None or not (done or m.group(2)):
            return None
        return m.group(1).strip(), _glm_args(m.group(2) or "", m.group(1).strip(), tools) if done else ""
    named = re.search(r'"name"\s*:\s*"([^"]*)"', body)
    if named is None or named.group(1) not in known:
        return None
    try:
        call = _json_call(body)
    except ValueError:
        return named.group(1), ""
    return call


def chunk_tokens(tokens: list[str], stream_interval: int) -> list[str]:
    """The text of each stream chunk when `stream_interval` tokens are sent together."""
    step = max(1, stream_interval)
    return ["".join(tokens[i : i + step]) for i in range(0, len(tokens), step)]
