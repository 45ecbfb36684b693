"""Markup-leak signatures (parsers.md §4) and the canary verdicts built on them (parsers.md §5).

A canary prompt never asks the model to write markup, so a parser marker in `content` (or a streamed
`delta.content`) means the server's parser is missing or wrong: a *hard* signature, failed at once. The
structural signatures (finish_reason `tool_calls` without calls, an undeclared name, arguments that are not a
JSON object, stream and non-stream disagreeing) are definitive too. Everything else that is not a clean call
(no call, `length`, 5xx, timeout) is inconclusive: retried, never alarmed on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

PASS = "pass"
FAIL = "fail"
INCONCLUSIVE = "inconclusive"

# (marker, the parser family it implies). Tool-call markers first, reasoning markers after.
TOOL_MARKERS: tuple[tuple[str, str], ...] = (
    ("<｜tool▁calls▁begin｜>", "deepseekv3/deepseekv31"),
    ("<｜tool▁call▁begin｜>", "deepseekv3/deepseekv31"),
    ("<｜tool▁sep｜>", "deepseekv3/deepseekv31"),
    ("<｜tool▁call▁end｜>", "deepseekv3/deepseekv31"),
    ("<｜tool▁calls▁end｜>", "deepseekv3/deepseekv31"),
    ("<｜DSML｜function_calls>", "deepseekv32"),
    ("<function_calls>", "deepseekv32"),
    ("<｜DSML｜tool_calls>", "deepseekv4"),
    ("<｜DSML｜ calls>", "deepseekv41"),
    ("<｜DSML｜", "deepseekv32/deepseekv4/deepseekv41"),
    ("<｜tool_calls_begin｜>", "step3"),
    ("<｜tool_call_begin｜>", "step3"),
    ("<｜tool_sep｜>", "step3"),
    ("<steptml:invoke", "step3"),
    ("<steptml:parameter", "step3"),
    ("<tool_call>", "qwen/hermes/qwen3_coder/glm45/glm47"),
    ("</tool_call>", "qwen/hermes/qwen3_coder/glm45/glm47"),
    ("<function=", "qwen3_coder/step3p5/mimo"),
    ("<parameter=", "qwen3_coder/step3p5/mimo"),
    ("<arg_key>", "glm45/glm47/ling3/poolside_v1/spark25"),
    ("<arg_value>", "glm45/glm47/ling3/poolside_v1/spark25"),
    ("<iquest_tool_call>", "iquest_q1"),
    ("<tool_calls>", "hunyuan"),
    ("<tool_sep>", "hunyuan"),
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("<|tool_call_begin|>", "kimi_k2"),
    ("<|tool_call_argument_begin|>", "kimi_k2"),
    ("<|tool_call_end|>", "kimi_k2/lfm2"),
    ("<|tool_calls_section_end|>", "kimi_k2"),
    ("<|open|>tools<|sep|>", "kimi_k3"),
    ("<|open|>call tool=", "kimi_k3"),
    ("<|open|>argument", "kimi_k3"),
    ("<|close|>call<|sep|>", "kimi_k3"),
    ("<|open|>response<|sep|>", "kimi_k3"),
    ("<|close|>message<|sep|>", "kimi_k3"),
    ("<ifm|tool_calls>", "k2_horizon"),
    ("<ifm|tool_call>", "k2_horizon"),
    ("<ifm|arg_key>", "k2_horizon"),
    ("<|channel|>commentary to=functions.", "gpt-oss"),
    ("<|constrain|>json", "gpt-oss"),
    ("<|message|>", "gpt-oss/muse"),
    ("<|call|>", "gpt-oss"),
    ("<|start|>assistant", "gpt-oss"),
    ("<atem:function_calls>", "muse"),
    ("<atem:invoke", "muse"),
    ("<atem:parameter", "muse"),
    ("[TOOL_CALLS]", "mistral"),
    ("[ARGS]", "mistral"),
    ("[CALL_ID]", "mistral"),
    ("<|python_tag|>", "llama3"),
    ("<|tool_call_start|>", "lfm2"),
    ("<|tool_call>", "gemma4"),
    ("<tool_call|>", "gemma4"),
    ('<|"|>', "gemma4"),
    ("<|action_start|>", "interns1"),
    ("<|plugin|>", "interns1"),
    ("<|action_end|>", "interns1"),
    ("function call<|role_sep|>", "gigachat3"),
    ("<|function_call|>", "gigachat3"),
    ("<|message_sep|>", "gigachat3"),
    ("<｜GCML｜", "gigachat35"),
    ("<|tools_prefix|>", "apertus2509"),
    ("<|tools_suffix|>", "apertus2509"),
    ("<|START_ACTION|>", "cohere_command4"),
    ("<|END_ACTION|>", "cohere_command4"),
    ("<dots_function_call>", "dots"),
    ("<function name=", "minicpm5"),
    ("<function", "minicpm5"),
    ("<param name=", "minicpm5"),
    ("<minimax:tool_call>", "minimax-m2"),
    ("<invoke name=", "minimax-m2/deepseekv32"),
    ("]<]minimax[>[", "minimax-m3"),
    ("<|content_invoke_tool_json|>", "inkling"),
    ("<|message_model|>", "inkling"),
    ("<|end_message|>", "inkling"),
    ("<|content_text|>", "inkling"),
)
THINK_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "think"),
    ("</think>", "think"),
    ("◁think▷", "kimi"),
    ("◁/think▷", "kimi"),
    ("<mm:think>", "minimax-m3"),
    ("</mm:think>", "minimax-m3"),
    ("[THINK]", "mistral"),
    ("[/THINK]", "mistral"),
    ("<|channel>", "gemma4"),
    ("<channel|>", "gemma4"),
    ("<|channel|>analysis", "gpt-oss"),
    ("<|end|>", "gpt-oss"),
    ("<|eom|>", "muse"),
    ("<|inner_prefix|>", "apertus2509"),
    ("<|inner_suffix|>", "apertus2509"),
    ("<|START_THINKING|>", "cohere_command4"),
    ("<|END_THINKING|>", "cohere_command4"),
    ("<|START_TEXT|>", "cohere_command4"),
    ("<|END_TEXT|>", "cohere_command4"),
    ("<|content_thinking|>", "inkling"),
    ("<|open|>think<|sep|>", "kimi_k3"),
    ("<|close|>think<|sep|>", "kimi_k3"),
    ("<ifm|think", "k2_horizon"),
    ("</ifm|think", "k2_horizon"),
)
# Shapes with no special token: Kimi call ids, a Gemma call body, bare llama3 JSON, a pythonic call list.
_TOOL_SHAPES = (
    r"functions\.\w+:\d+",
    r"call:\w+\{",
    r"^\s*\{\s*\"name\"\s*:\s*\"\w+\"",
    r"^\s*\[\s*\w+\(\s*\w+\s*=",
)


def _alternation(markers: Iterable[tuple[str, str]], shapes: Iterable[str] = ()) -> re.Pattern[str]:
    ordered = sorted({m for m, _ in markers}, key=len, reverse=True)
    return re.compile("|".join([*(re.escape(m) for m in ordered), *shapes]), re.MULTILINE)


_TOOL_RE = _alternation(TOOL_MARKERS, _TOOL_SHAPES)
_THINK_RE = _alternation(THINK_MARKERS)
_HINTS = dict(TOOL_MARKERS) | dict(THINK_MARKERS)


def find_leaks(text: str | None, *, think: bool = True) -> list[str]:
    """Distinct leak markers found in `text` (tool markers always; reasoning markers when `think`)."""
    if not text:
        return []
    found = [m.group(0) for m in _TOOL_RE.finditer(text)]
    if think:
        found += [m.group(0) for m in _THINK_RE.finditer(text)]
    return list(dict.fromkeys(found))


def implied_parsers(markers: Iterable[str]) -> list[str]:
    """The parser families the markers point at (shape matches report `shape`)."""
    return list(dict.fromkeys(_HINTS.get(m, "shape") for m in markers))


@dataclass(frozen=True)
class ToolCall:
    """One reassembled tool call."""

    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True)
class ChatResult:
    """What one chat completion returned, reassembled from JSON or SSE; `status` None = no HTTP answer."""

    status: int | None
    content: str = ""
    reasoning: str = ""
    calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    completion_tokens: int | None = None
    stream_errors: tuple[str, ...] = ()  # structural problems seen while reassembling a stream
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    """pass / fail / inconclusive, with the reason and the evidence."""

    verdict: str
    reason: str
    leaks: tuple[str, ...] = ()
    cities: tuple[str, ...] = ()
    answered: bool = True  # False: no usable answer (no HTTP response, an error status, out of budget)


def _unanswered(result: ChatResult) -> Verdict | None:
    if result.status is None:
        return Verdict(INCONCLUSIVE, f"no answer: {result.error or 'timeout'}", answered=False)
    if result.status != 200:
        said = f": {result.error}" if result.error else ""
        return Verdict(INCONCLUSIVE, f"HTTP {result.status}{said}", answered=False)
    return None


def judge_tool(result: ChatResult, tool: str, city: str) -> Verdict:
    """The tool-call canary verdict for one response (parsers.md §5, tier 1)."""
    unanswered = _unanswered(result)
    if unanswered is not None:
        return unanswered
    leaks = find_leaks(result.content)
    if leaks:
        return Verdict(FAIL, f"markup in content ({', '.join(implied_parsers(leaks))})", tuple(leaks))
    hidden = find_leaks(result.reasoning, think=False)
    if hidden and tool in result.reasoning:
        return Verdict(FAIL, "a complete tool call inside reasoning_content", tuple(hidden))
    if result.stream_errors:
        return Verdict(FAIL, "; ".join(result.stream_errors))
    if result.finish_reason == "tool_calls" and not result.calls:
        return Verdict(FAIL, "finish_reason tool_calls without tool calls")
    cities: list[str] = []
    for call in result.calls:
        if call.name != tool:
            return Verdict(FAIL, f"undeclared tool name {call.name!r}")
        try:
            args = json.loads(call.arguments)
        except ValueError:
            return Verdict(FAIL, f"arguments are not JSON: {call.arguments[:80]!r}")
        if not isinstance(args, dict) or not isinstance(args.get("city"), str):
            return Verdict(FAIL, f"arguments lack the required city: {call.arguments[:80]!r}")
        cities.append(args["city"])
    if result.calls:
        if not all(city.lower() in c.lower() for c in cities):
            return Verdict(FAIL, f"wrong city {cities} (asked {city})", cities=tuple(cities))
        return Verdict(PASS, f"{len(result.calls)} call(s) to {tool}", cities=tuple(cities))
    if result.finish_reason == "length":
        return Verdict(INCONCLUSIVE, "finish_reason length: budget too small", answered=False)
    if not result.content.strip() and not result.reasoning and (result.completion_tokens or 0) > 0:
        return Verdict(INCONCLUSIVE, "tokens generated but nothing delivered (swallowed)")
    return Verdict(INCONCLUSIVE, "the model answered without a tool call")


def judge_pair(non_stream: Verdict, stream: Verdict) -> Verdict:
    """Both runs of the same request at temperature 0: a definitive failure, or a disagreement, fails."""
    for v, how in ((non_stream, "non-stream"), (stream, "stream")):
        if v.verdict == FAIL:
            return Verdict(FAIL, f"{how}: {v.reason}", v.leaks, v.cities)
    both_answered = non_stream.answered and stream.answered
    if both_answered and (non_stream.verdict == PASS) != (stream.verdict == PASS):
        good, bad = (non_stream, stream) if non_stream.verdict == PASS else (stream, non_stream)
        which = "non-stream" if good is non_stream else "stream"
        return Verdict(FAIL, f"stream and non-stream disagree: only {which} called the tool ({bad.reason})")
    if non_stream.verdict == stream.verdict == PASS:
        ns = {c.lower() for c in non_stream.cities}
        st = {c.lower() for c in stream.cities}
        if ns != st:
            return Verdict(FAIL, f"stream and non-stream disagree: {sorted(ns)} vs {sorted(st)}")
        return Verdict(PASS, f"stream and non-stream agree: {non_stream.reason}", cities=non_stream.cities)
    pending = non_stream if non_stream.verdict != PASS else stream
    return Verdict(INCONCLUSIVE, pending.reason)


def judge_reasoning(result: ChatResult, answer: str) -> Verdict:
    """The reasoning canary verdict (parsers.md §5, tier 2)."""
    unanswered = _unanswered(result)
    if unanswered is not None:
        return unanswered
    leaks = find_leaks(result.content)
    if leaks:
        return Verdict(
            FAIL, f"reasoning markup in content ({', '.join(implied_parsers(leaks))})", tuple(leaks)
        )
    if not result.content.strip() and answer in result.reasoning and result.finish_reason == "stop":
        return Verdict(
            FAIL, "the answer landed in reasoning_content, content empty (forced-reasoning mismatch)"
        )
    if result.finish_reason == "length" and not result.content.strip():
        return Verdict(INCONCLUSIVE, "finish_reason length with empty content")
    if not result.reasoning:
        return Verdict(INCONCLUSIVE, "no reasoning_content returned")
    if answer not in result.content:
        return Verdict(INCONCLUSIVE, f"content does not contain {answer}")
    return Verdict(PASS, "reasoning separated, answer in content")
