"""The simulator's "model": raw output markup of each supported model family.

Pure and deterministic: the same inputs and seed give the same tokens. The markup is what the
family's real model writes before any server-side parsing, so a missing or wrong parser on the
server leaks it exactly as SGLang would.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

FAMILIES: tuple[str, ...] = ("kimi_k2", "deepseekv3", "deepseekv31", "qwen25", "glm45", "glm47", "hermes")

# Special tokens per family: each is one token in the output, never split.
_MARKERS: dict[str, tuple[str, ...]] = {
    "kimi_k2": (
        "<think>",
        "</think>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    ),
    "deepseekv3": (
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
    ),
    "qwen25": ("<think>", "</think>", "<tool_call>", "</tool_call>"),
    "glm45": (
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ),
    "hermes": ("<tool_call>", "</tool_call>"),
}
_MARKERS["deepseekv31"] = ("</think>", *_MARKERS["deepseekv3"])
_MARKERS["glm47"] = _MARKERS["glm45"]

_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"kimi[-_]?k2", "kimi_k2"),
    (r"deepseek[-_]?v3[._-]?(1|2)", "deepseekv31"),
    (r"deepseek[-_]?(v3|r1)", "deepseekv3"),
    (r"glm[-_]?(4\.7|4\.8|5)", "glm47"),
    (r"glm", "glm45"),
    (r"hermes", "hermes"),
    (r"qwen|qwq", "qwen25"),
)

_CITY = re.compile(
    r"\b(?:in|for|at)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*"
    r"(?:\s*(?:,|\band\b)\s*[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)*)"
)
_ARITH = re.compile(r"(-?\d+)\s*([-+*x×/])\s*(-?\d+)")
_TOKEN = re.compile(r"\s+|\w+|[^\w\s]+")
_ANSWERS = (
    "Here is a short answer.",
    "I can help with that.",
    "That is a good question.",
    "Sure, happy to help.",
)
_WORDS = ("the", "model", "server", "is", "ready", "and", "serving", "tokens", "for", "a", "request")


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat completion request that the model looks at."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    max_tokens: int
    chat_template_kwargs: dict[str, Any] | None
    temperature: float


def detect_family(model_path: str, override: str | None = None) -> str:
    """The family of a model path (e.g. "moonshotai/Kimi-K2.5" -> "kimi_k2"); `override` wins."""
    if override:
        if override not in FAMILIES:
            raise ValueError(f"unknown model family {override!r}; expected one of {', '.join(FAMILIES)}")
        return override
    lowered = model_path.lower()
    for pattern, family in _PATTERNS:
        if re.search(pattern, lowered):
            return family
    return "qwen25"


def _is_qwen2(model_path: str) -> bool:
    return re.search(r"qwen2|qwq", model_path.lower()) is not None


def expected_parsers(model_path: str, family: str) -> tuple[str | None, str | None]:
    """The (tool_call_parser, reasoning_parser) a correct launch of this model names."""
    table: dict[str, tuple[str | None, str | None]] = {
        "kimi_k2": ("kimi_k2", "kimi_k2"),
        "deepseekv3": ("deepseekv3", None),
        "deepseekv31": ("deepseekv31", "deepseek-v3"),
        "qwen25": ("qwen25", None if _is_qwen2(model_path) else "qwen3"),
        "glm45": ("glm45", "glm45"),
        "glm47": ("glm47", "glm45"),
        "hermes": ("hermes", None),
    }
    return table[family]


def thinks(family: str, model_path: str, chat_template_kwargs: dict[str, Any] | None) -> bool:
    """Whether the model writes a reasoning block for this request."""
    kwargs = chat_template_kwargs or {}
    if family == "kimi_k2":
        return kwargs.get("thinking") is not False
    if family == "deepseekv31":
        return kwargs.get("thinking") is True
    if family in ("glm45", "glm47") or (family == "qwen25" and not _is_qwen2(model_path)):
        return kwargs.get("enable_thinking") is not False
    return False


def tokenize(text: str, family: str) -> list[str]:
    """Split text into tokens: the family's markers whole, other text in word-ish pieces."""
    markers = sorted(_MARKERS[family], key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(m) for m in markers))
    tokens: list[str] = []
    pos = 0
    for match in pattern.finditer(text):
        tokens.extend(_TOKEN.findall(text[pos : match.start()]))
        tokens.append(match.group())
        pos = match.end()
    tokens.extend(_TOKEN.findall(text[pos:]))
    return tokens


def _digest(*parts: object) -> int:
    data = json.dumps(parts, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            return " ".join(str(p) for p in parts)
    return ""


def cities(prompt: str) -> list[str]:
    """The city names a prompt asks about, in order ("weather in Paris and Oslo" -> both)."""
    found: list[str] = []
    for match in _CITY.finditer(prompt):
        for name in re.split(r"\s*(?:,|\band\b)\s*", match.group(1)):
            if name and name not in found:
                found.append(name)
    return found


def _plausible(name: str, schema: dict[str, Any]) -> Any:
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    values: dict[str, Any] = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    if kind in values:
        return values[kind]
    if "unit" in name:
        return "celsius"
    if "date" in name:
        return "2025-01-01"
    return "example"


def _call_arguments(tool: dict[str, Any], prompt: str) -> list[dict[str, Any]]:
    """One argument object per call: one per city named when the tool takes a city."""
    params = tool.get("function", {}).get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = [r for r in params.get("required") or [] if isinstance(r, str)]
    city_key = next((k for k in props if "city" in k.lower() or "location" in k.lower()), None)
    base = {k: _plausible(k.lower(), props.get(k) or {}) for k in required if k != city_key}
    if city_key is None:
        return [base]
    return [{city_key: city, **base} for city in (cities(prompt) or ["Paris"])]


def _tool_markup(family: str, name: str, calls: list[dict[str, Any]]) -> str:
    args = [json.dumps(c, ensure_ascii=False) for c in calls]
    if family == "kimi_k2":
        body = "".join(
            f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{a}<|tool_call_end|>"
            for i, a in enumerate(args)
        )
        return f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>"
    if family == "deepseekv3":
        body = "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{a}\n```<｜tool▁call▁end｜>"
            for a in args
        )
        return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"
    if family == "deepseekv31":
        body = "".join(f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>" for a in args)
        return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"
    if family in ("glm45", "glm47"):
        sep = "\n" if family == "glm45" else ""
        blocks = []
        for call in calls:
            pairs = "".join(
                f"<arg_key>{k}</arg_key>{sep}<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>{sep}"
                for k, v in call.items()
            )
            blocks.append(f"<tool_call>{name}{sep}{pairs}</tool_call>")
        return "\n".join(blocks)
    objs = [json.dumps({"name": name, "arguments": c}, ensure_ascii=False) for c in calls]
    if family == "hermes":
        return "".join(f"<tool_call>{o}</tool_call>" for o in objs)
    return "\n".join(f"<tool_call>\n{o}\n</tool_call>" for o in objs)


def _answer(prompt: str, pick: int) -> str:
    match = _ARITH.search(prompt)
    if match is None:
        return _ANSWERS[pick % len(_ANSWERS)]
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    if op == "+":
        return str(a + b)
    if op == "-":
        return str(a - b)
    if op != "/":
        return str(a * b)
    if b == 0:
        return "undefined"
    return str(a // b) if a % b == 0 else str(round(a / b, 4))


def _with_reasoning(family: str, reasoning: str, body: str) -> str:
    if family == "deepseekv31":
        return f"{reasoning}</think>{body}"
    if family == "qwen25":
        return f"<think>\n{reasoning}\n</think>\n\n{body}"
    return f"<think>{reasoning}</think>{body}"


def generate_chat(family: str, model_path: str, req: ChatRequest, seed: int) -> tuple[list[str], str]:
    """The raw output tokens for a chat request and the raw finish reason ("stop" or "length")."""
    prompt = _last_user_text(req.messages)
    pick = _digest(family, prompt, seed, req.temperature)
    tool = req.tools[0] if req.tools else None
    if isinstance(req.tool_choice, dict):
        wanted = (req.tool_choice.get("function") or {}).get("name")
        tool = next((t for t in req.tools or [] if t.get("function", {}).get("name") == wanted), tool)
    if tool is not None and req.tool_choice != "none":
        name = str(tool.get("function", {}).get("name", "tool"))
        calls = _call_arguments(tool, prompt)
        body = _tool_markup(family, name, calls)
        if family in ("glm45", "glm47"):
            body = "\n" + body
        where = " and ".join(str(c.get("city", "")) for c in calls if "city" in c) or "this request"
        reasoning = f"The user asks about {where}. I should call {name} to get the answer."
    else:
        body = _answer(prompt, pick)
        reasoning = f"Let me think about this. The question is: {prompt.strip()[:80]} The answer is {body}"
    text = (
        _with_reasoning(family, reasoning, body)
        if thinks(family, model_path, req.chat_template_kwargs)
        else body
    )
    tokens = tokenize(text, family)
    if len(tokens) > req.max_tokens:
        return tokens[: req.max_tokens], "length"
    return tokens, "stop"


def generate_text(prompt: str, max_new_tokens: int, seed: int) -> list[str]:
    """Plain continuation tokens for /generate: a short sentence, cut at max_new_tokens."""
    pick = _digest(prompt, seed)
    count = 8 + pick % 8
    words = [_WORDS[(pick >> (i * 3)) % len(_WORDS)] for i in range(count)]
    tokens: list[str] = []
    for i, word in enumerate(words):
        tokens.append(word if i == 0 else " " + word)
    tokens.append(".")
    return tokens[: max(0, max_new_tokens)]
