"""Output-correctness canaries (parsers.md §5): tool call (non-stream + stream), reasoning, config check.

The tool canary asks for the weather with a tiny `get_weather(city)` tool, `tool_choice: auto` (the detector
path), temperature 0, thinking off, a small `max_tokens`, and sends the same body streamed. Verdicts come from
`policies.leaks`. Every request has a timeout and every body is read with a byte cap.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from policies.leaks import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    ChatResult,
    ToolCall,
    Verdict,
    find_leaks,
    judge_pair,
    judge_reasoning,
    judge_tool,
)
from policies.model import CanaryValues, Observation, ProbeSettings
from policies.parsers_table import parsers_match
from probes.base import auth_headers, error_message, read_capped
from probes.pd_pair import PdPair, prefill_half

TOOL_NAME = "get_weather"
MAX_BODY = 1024 * 1024
SYSTEM = (
    "You are a tool-using assistant. Weather questions must be answered only by calling get_weather. "
    "Do not answer from memory."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
REASONING_ANSWER = "42"
# What a hostile or broken body can raise while it is read or decoded, besides aiohttp's ClientError: an
# over-long line (LineTooLong, an HttpProcessingError), malformed JSON, JSON nested deeper than the recursion
# limit, JSON of the wrong shape.
MALFORMED = (HttpProcessingError, ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError)


def tool_body(model: str, city: str, max_tokens: int, stream: bool, rid: str = "") -> dict[str, Any]:
    """The tier-1 canary request for one city."""
    body: dict[str, Any] = {
        "model": model,
        "temperature": 0,
        "seed": 7,
        "max_tokens": max_tokens,
        "stream": stream,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is the weather in {city} right now?"},
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": False, "thinking": False},
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if rid:
        body["rid"] = rid
    return body


def reasoning_body(model: str, max_tokens: int) -> dict[str, Any]:
    """The tier-2 canary: thinking on, no tools, a one-number answer."""
    return {
        "model": model,
        "temperature": 0,
        "max_tokens": max(max_tokens, 512),
        "messages": [{"role": "user", "content": "What is 17+25? Reply with only the number."}],
        "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
    }


def from_json(data: Any) -> ChatResult:
    """A non-stream chat completion body as a ChatResult."""
    try:
        choice = data["choices"][0]
        msg = choice.get("message") or {}
        calls = tuple(
            ToolCall(
                c.get("id"),
                (c.get("function") or {}).get("name"),
                (c.get("function") or {}).get("arguments") or "",
            )
            for c in msg.get("tool_calls") or []
        )
        usage = data.get("usage") or {}
        return ChatResult(
            200,
            msg.get("content") or "",
            msg.get("reasoning_content") or "",
            calls,
            choice.get("finish_reason"),
            usage.get("completion_tokens"),
        )
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        return ChatResult(None, error=f"malformed completion: {type(exc).__name__}")


def reassemble(events: list[Any], done: bool) -> ChatResult:
    """Join SSE chunks: content, reasoning, and per index the id/name of the first chunk plus argument fragments."""
    content: list[str] = []
    reasoning: list[str] = []
    ids: dict[int, set[str]] = {}
    names: dict[int, set[str]] = {}
    args: dict[int, list[str]] = {}
    errors: list[str] = []
    finish: str | None = None
    tokens: int | None = None
    for event in events:
        if not isinstance(event, dict):
            continue
        if "error" in event:
            return ChatResult(None, error=f"in-stream error: {str(event['error'])[:160]}")
        if isinstance(event.get("usage"), dict):
            tokens = event["usage"].get("completion_tokens", tokens)
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if args and find_leaks(delta["content"]):
                    errors.append("markup in content after the first tool delta")
                content.append(delta["content"])
            if delta.get("reasoning_content"):
                reasoning.append(delta["reasoning_content"])
            for tc in delta.get("tool_calls") or []:
                index = int(tc.get("index", 0))
                fn = tc.get("function") or {}
                if tc.get("id"):
                    ids.setdefault(index, set()).add(tc["id"])
                if fn.get("name"):
                    names.setdefault(index, set()).add(fn["name"])
                if fn.get("arguments"):
                    if index not in names:
                        errors.append(f"arguments before the name for call {index}")
                    args.setdefault(index, []).append(fn["arguments"])
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    calls: list[ToolCall] = []
    for index in sorted(set(names) | set(args)):
        if len(ids.get(index, ())) > 1 or len(names.get(index, ())) > 1:
            errors.append(f"call {index} has several ids or names")
        calls.append(
            ToolCall(
                next(iter(ids.get(index, ())), None),
                next(iter(names.get(index, ())), None),
                "".join(args.get(index, [])),
            )
        )
    if calls and finish not in ("tool_calls", "length"):
        errors.append(f"tool calls streamed but finish_reason {finish!r}")
    if not done:
        return ChatResult(None, "".join(content), error="stream ended without [DONE]")
    return ChatResult(
        200, "".join(content), "".join(reasoning), tuple(calls), finish, tokens, tuple(dict.fromkeys(errors))
    )


async def chat(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    timeout_s: float,
    max_bytes: int = MAX_BODY,
    api_key: str | None = None,
    pair: PdPair | None = None,
) -> ChatResult:
    """POST a chat completion (streamed or not) and reassemble it; never raises. With `pair`, `url` is the
    decode's and the same request goes to the pair's prefill at once, as SGLang's router sends it."""
    if pair is None:
        return await _chat(session, url, body, timeout_s, max_bytes, api_key)
    body = {**body, **pair.fields()}
    path = url.removeprefix(pair.decode_url)
    result, prefill = await asyncio.gather(
        _chat(session, url, body, timeout_s, max_bytes, api_key),
        prefill_half(session, pair.prefill_url + path, body, timeout_s, api_key),
    )
    if prefill and result.status == 200:
        return ChatResult(None, error=prefill)
    if prefill and not result.error:
        return ChatResult(result.status, error=prefill)
    return result


async def _chat(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    timeout_s: float,
    max_bytes: int,
    api_key: str | None,
) -> ChatResult:
    try:
        async with session.post(
            url, json=body, headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                return ChatResult(resp.status, error=error_message(await read_capped(resp, 4096)))
            if not body.get("stream"):
                raw = await read_capped(resp, max_bytes)
                return from_json(json.loads(raw))
            return await _read_stream(resp, max_bytes)
    except TimeoutError:
        return ChatResult(None, error=f"no answer within {timeout_s:g}s")
    except (aiohttp.ClientError, OSError) as exc:
        return ChatResult(None, error=f"{type(exc).__name__}: {exc}"[:200])
    except MALFORMED as exc:
        return ChatResult(None, error=f"malformed body: {type(exc).__name__}: {str(exc)[:120]}")


async def _read_stream(resp: aiohttp.ClientResponse, max_bytes: int) -> ChatResult:
    events: list[Any] = []
    total = 0
    done = False
    async for raw in resp.content:
        total += len(raw)
        if total > max_bytes:
            return ChatResult(None, error=f"stream larger than {max_bytes} bytes")
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            break
        events.append(json.loads(payload))
    return reassemble(events, done)


def _observation(
    probe: str, verdict: Verdict, start: float, extra: CanaryValues | None = None
) -> Observation:
    end = time.monotonic()
    body = CanaryValues(
        verdict=verdict.verdict, reason=verdict.reason, leaks=list(verdict.leaks), cities=list(verdict.cities)
    )
    body.update(extra or {})
    return Observation(
        probe, end, verdict.verdict == PASS, f"{verdict.verdict}: {verdict.reason}", end - start, body
    )


async def tool_canary(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    settings: ProbeSettings,
    city: str = "Paris",
    pair: PdPair | None = None,
    dp_rank: int | None = None,
) -> Observation:
    """Non-stream then stream; a leak, a structural failure or a disagreement fails (probe `canary_tool`). With
    `dp_rank`, both go to that DP rank (`routed_dp_rank`)."""
    start = time.monotonic()
    url = f"{base_url}/v1/chat/completions"
    rid = f"canary-{time.time_ns()}"
    extra = _routed(rid, dp_rank)
    plain = await chat(
        session,
        url,
        _to(tool_body(model, city, settings.canary_max_tokens, False, rid + "-0"), dp_rank),
        settings.canary_timeout_s,
        api_key=settings.api_key,
        pair=pair,
    )
    v_plain = judge_tool(plain, TOOL_NAME, city)
    if v_plain.verdict == FAIL or not v_plain.answered:
        return _observation("canary_tool", _prefixed(v_plain, "non-stream"), start, extra)
    streamed = await chat(
        session,
        url,
        _to(tool_body(model, city, settings.canary_max_tokens, True, rid + "-1"), dp_rank),
        settings.canary_timeout_s,
        api_key=settings.api_key,
        pair=pair,
    )
    v_stream = judge_tool(streamed, TOOL_NAME, city)
    return _observation("canary_tool", judge_pair(v_plain, v_stream), start, extra)


def _to(body: dict[str, Any], dp_rank: int | None) -> dict[str, Any]:
    """The request routed to one DP rank (SGLang's `routed_dp_rank`), or as it is."""
    return body if dp_rank is None else {**body, "routed_dp_rank": dp_rank}


def _routed(rid: str, dp_rank: int | None) -> CanaryValues:
    values = CanaryValues(rid=rid)
    if dp_rank is not None:
        values["dp_rank"] = dp_rank
    return values


def _prefixed(v: Verdict, how: str) -> Verdict:
    return Verdict(v.verdict, f"{how}: {v.reason}", v.leaks, v.cities, v.answered)


async def reasoning_canary(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    settings: ProbeSettings,
    pair: PdPair | None = None,
    dp_rank: int | None = None,
) -> Observation:
    """Thinking on, no tools: reasoning separated and the answer in content (probe `canary_reasoning`); with
    `dp_rank`, routed to that DP rank."""
    start = time.monotonic()
    result = await chat(
        session,
        f"{base_url}/v1/chat/completions",
        _to(reasoning_body(model, settings.canary_max_tokens), dp_rank),
        settings.canary_timeout_s,
        api_key=settings.api_key,
        pair=pair,
    )
    extra = CanaryValues(dp_rank=dp_rank) if dp_rank is not None else None
    return _observation("canary_reasoning", judge_reasoning(result, REASONING_ANSWER), start, extra)


def _parses_as(key: str, expected: str, actual: object) -> bool:
    """`/server_info`'s `key` names the expected parser or an alias of it (a value not a string never does)."""
    if actual is not None and not isinstance(actual, str):
        return False
    return parsers_match(expected, actual, reasoning=key == "reasoning_parser")


async def config_check(session: aiohttp.ClientSession, base_url: str, settings: ProbeSettings) -> Observation:
    """`/server_info` parser settings against the expected ones (probe `config_check`; None = not checked)."""
    start = time.monotonic()
    expected = {
        "tool_call_parser": settings.expected_tool_parser,
        "reasoning_parser": settings.expected_reasoning_parser,
    }
    try:
        async with session.get(
            f"{base_url}/server_info",
            headers=auth_headers(settings.api_key),
            timeout=aiohttp.ClientTimeout(total=settings.canary_timeout_s),
        ) as resp:
            status = resp.status
            raw = await read_capped(resp, MAX_BODY) if status == 200 else b""
        info = json.loads(raw) if raw else {}
    except (aiohttp.ClientError, OSError, TimeoutError, *MALFORMED) as exc:
        return _observation(
            "config_check",
            Verdict(INCONCLUSIVE, f"/server_info: {type(exc).__name__}", answered=False),
            start,
        )
    if status != 200 or not isinstance(info, dict):
        return _observation(
            "config_check", Verdict(INCONCLUSIVE, f"/server_info HTTP {status}", answered=False), start
        )
    absent = [k for k, v in expected.items() if v is not None and k not in info]
    if absent:  # SGLang always lists both parsers (null when unset): this body is not its server_info
        reason = f"/server_info lacks {', '.join(absent)}"
        return _observation("config_check", Verdict(INCONCLUSIVE, reason, answered=False), start)
    actual = {k: info.get(k) for k in expected}
    wrong = [
        f"{k}={actual[k]!r} (expected {v!r})"
        for k, v in expected.items()
        if v is not None and not _parses_as(k, v, actual[k])
    ]
    if wrong:
        return _observation(
            "config_check",
            Verdict(FAIL, "; ".join(wrong)),
            start,
            CanaryValues(actual=actual, expected=expected),
        )
    return _observation(
        "config_check",
        Verdict(PASS, "parsers as expected"),
        start,
        CanaryValues(actual=actual, expected=expected),
    )
