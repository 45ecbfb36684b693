"""OpenAI-compatible request validation and response bodies of the simulator, in SGLang's shapes.

Pure: the HTTP server (content type, JSON decoding, streaming transport) is elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.families import ChatRequest
from simulator.parsers.base import ParsedMessage

DEFAULT_MAX_TOKENS = 2048
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_CHOICES = frozenset({"auto", "required", "none"})


@dataclass(frozen=True)
class ApiError:
    """An error answer: HTTP status and JSON body."""

    status: int
    body: dict[str, Any]


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(
        400, {"object": "error", "message": message, "type": "BadRequestError", "param": param, "code": 400}
    )


def _tool_names(tools: list[Any]) -> list[str] | ApiError:
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return _bad(f"tools[{i}].function.name is required.", "tools")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            return _bad(f"Tool {i} function has invalid 'parameters' schema: not an object", "tools")
        names.append(function["name"])
    return names


def _tool_choice(raw: Any, names: list[str]) -> Any:
    if raw is None:
        return "auto" if names else "none"
    if isinstance(raw, str):
        if raw not in _CHOICES:
            return _bad(f"Invalid tool_choice {raw!r}: expected auto, required, none or a function.")
        if raw == "required" and not names:
            return _bad("Tools cannot be empty if tool choice is set to required.")
        return raw
    name = (raw.get("function") or {}).get("name") if isinstance(raw, dict) else None
    if not isinstance(name, str):
        return _bad("Invalid tool_choice: a named choice needs function.name.")
    if not names:
        return _bad("Tools cannot be empty if tool choice is set to a specific tool.")
    if name not in names:
        return _bad(f"Tool '{name}' not found in tools list.")
    return raw


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float | ApiError:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        return _bad(f"{key} must be a number between {low} and {high}.", key)
    return float(value)


def parse_chat_request(body: object) -> ChatRequest | ApiError:
    """Validate a decoded /v1/chat/completions body as SGLang does; a ChatRequest or the error to send."""
    if not isinstance(body, dict):
        return _bad("The request body must be a JSON object.")
    # SGLang 0.5.23 serves one model and ignores the request's model name (it answers 200 for any name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _bad("Messages cannot be empty.", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            return _bad(f"messages[{i}] needs a role among {', '.join(sorted(_ROLES))}.", "messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return _bad("tools must be a list.", "tools")
    names = _tool_names(tools or [])
    if isinstance(names, ApiError):
        return names
    choice = _tool_choice(body.get("tool_choice"), names)
    if isinstance(choice, ApiError):
        return choice
    max_tokens = next(
        (body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None),
        DEFAULT_MAX_TOKENS,
    )
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return _bad("max_tokens must be a positive integer.", "max_tokens")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    if isinstance(temperature, ApiError):
        return temperature
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        return _bad("chat_template_kwargs must be an object.", "chat_template_kwargs")
    return ChatRequest(messages, tools or None, choice, max_tokens, kwargs, temperature)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


def chat_completion(
    id: str, model: str, created: int, msg: ParsedMessage, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A non-streaming chat.completion body; tool_calls is null when nothing parsed (as SGLang 0.5.23)."""
    calls = [
        {
            "id": c.id,
            "index": c.index,
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in msg.tool_calls
    ]
    message = {
        "role": "assistant",
        "content": msg.content or "",
        "reasoning_content": msg.reasoning_content,
        "tool_calls": calls or None,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": msg.finish_reason,
        "matched_stop": None,
    }
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens),
        "metadata": {"weight_version": "default"},
    }


def chat_chunk(
    id: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None
) -> dict[str, Any]:
    """One chat.completion.chunk carrying a delta (and the finish reason on the last one)."""
    full = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None, **delta}
    choice = {
        "index": 0,
        "delta": full,
        "logprobs": None,
        "finish_reason": finish_reason,
        "matched_stop": None,
    }
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": None,
    }


def usage_chunk(
    id: str, model: str, created: int, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The trailing chunk sent with stream_options.include_usage: no choices, only usage."""
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": _usage(prompt_tokens, completion_tokens),
    }
