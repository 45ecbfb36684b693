"""Server-side parsing of the simulator: right parser parses, missing or wrong parser leaks like SGLang."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from simulator.families import ChatRequest, generate_chat
from simulator.parsers.base import ParsedMessage
from simulator.parsers.chat import StreamParser, chunk_tokens, parse_complete
from tests.support.sim_data import MODELS, TOOLS

# Leak signatures of parsers.md §4, one per family's tool markup.
LEAK = {
    "kimi_k2": "<|tool_calls_section_begin|>",
    "deepseekv3": "function<｜tool▁sep｜>get_weather\n```json",
    "deepseekv31": "get_weather<｜tool▁sep｜>{",
    "qwen25": '<tool_call>\n{"name"',
    "glm45": "<arg_key>",
    "glm47": "<arg_key>",
    "hermes": '<tool_call>{"name"',
}
QUIET = {"thinking": False, "enable_thinking": False}


@dataclass
class Streamed:
    content: str
    reasoning: str
    calls: list[tuple[str, str]]
    ids: list[str]
    finish: str


def _tokens(
    family: str, prompt: str, tools: list[dict[str, Any]] | None, kwargs: dict[str, Any] | None
) -> list[str]:
    req = ChatRequest(
        [{"role": "user", "content": prompt}], tools, "auto" if tools else "none", 512, kwargs, 0.0
    )
    return generate_chat(family, MODELS[family], req, 5)[0]


def _both(
    tokens: list[str],
    tool: str | None,
    reasoning: str | None,
    kwargs: dict[str, Any] | None,
    interval: int = 1,
) -> tuple[ParsedMessage, Streamed]:
    common: dict[str, Any] = {
        "tool_parser": tool,
        "reasoning_parser": reasoning,
        "tools": TOOLS,
        "tool_choice": "auto",
        "chat_template_kwargs": kwargs,
    }
    msg = parse_complete("".join(tokens), raw_finish_reason="stop", **common)
    parser = StreamParser(**common)
    deltas = [d for chunk in chunk_tokens(tokens, interval) for d in parser.feed(chunk)]
    tail, finish = parser.finish("stop")
    deltas += tail
    calls: dict[int, list[str]] = {}
    ids = []
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", ""])
            if call["id"]:
                ids.append(call["id"])
                assert call["function"]["arguments"] == "", "the first delta of a call carries no arguments"
            entry[0] += call["function"]["name"] or ""
            entry[1] += call["function"]["arguments"]
    streamed = Streamed(
        "".join(d.get("content", "") for d in deltas),
        "".join(d.get("reasoning_content", "") for d in deltas),
        [(n, a) for n, a in (calls[k] for k in sorted(calls))],
        ids,
        finish,
    )
    return msg, streamed


def _weather(family: str, tool: str | None, interval: int = 1) -> tuple[ParsedMessage, Streamed]:
    return _both(_tokens(family, "What is the weather in Oslo?", TOOLS, QUIET), tool, None, QUIET, interval)


@pytest.mark.parametrize("interval", [1, 4])
@pytest.mark.parametrize(
    ("family", "tool"),
    [
        ("kimi_k2", "kimi_k2"),
        ("deepseekv3", "deepseekv3"),
        ("deepseekv31", "deepseekv31"),
        ("qwen25", "qwen25"),
        ("qwen25", "hermes"),
        ("glm45", "glm45"),
        ("glm47", "glm47"),
        ("hermes", "hermes"),
    ],
)
def test_matching_parser_extracts_the_call(family: str, tool: str, interval: int) -> None:
    """The matching parser returns the call, finish_reason tool_calls, and no markup, stream or not."""
    msg, streamed = _weather(family, tool, interval if not family.startswith("deepseek") else 1)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert msg.finish_reason == "tool_calls" and LEAK[family] not in (msg.content or "")
    assert [(n, json.loads(a)) for n, a in streamed.calls] == [("get_weather", {"city": "Oslo"})]
    assert streamed.finish == "tool_calls" and streamed.content.strip() == ""


@pytest.mark.parametrize("family", list(MODELS))
@pytest.mark.parametrize("tool", [None, "other-family", "pythonic"])
def test_missing_or_foreign_parser_leaks_raw_markup(family: str, tool: str | None) -> None:
    """No parser, another family's parser or an unknown one: markup in content, no calls, stop."""
    other = {"kimi_k2": "qwen25", "qwen25": "kimi_k2", "hermes": "deepseekv3"}.get(family, "kimi_k2")
    msg, streamed = _weather(family, other if tool == "other-family" else tool)
    assert LEAK[family] in (msg.content or "")
    assert msg.tool_calls == [] and msg.finish_reason == "stop"
    assert LEAK[family].split("\n")[0] in streamed.content
    assert streamed.calls == [] and streamed.finish == "stop"


def test_deepseekv3_parser_on_v31_output() -> None:
    """v3 on V3.1 (as real 0.5.23): no call, finish stop, raw content; the stream swallows everything."""
    msg, streamed = _weather("deepseekv31", "deepseekv3")
    assert msg.finish_reason == "stop" and msg.tool_calls == []
    assert (
        msg.content is not None
        and msg.content.startswith("<｜tool▁calls▁begin｜>")
        and LEAK["deepseekv31"] in msg.content
    )
    assert (streamed.content, streamed.calls, streamed.finish) == ("", [], "stop")


def test_deepseekv31_parser_on_v3_output() -> None:
    """v31 on V3: no call non-stream; the stream emits a call named `function` with fenced arguments."""
    msg, streamed = _weather("deepseekv3", "deepseekv31")
    assert msg.finish_reason == "stop" and msg.tool_calls == [] and LEAK["deepseekv3"] in (msg.content or "")
    assert [n for n, _ in streamed.calls] == ["function"]
    assert streamed.calls[0][1].startswith("get_weather\n```json") and streamed.finish == "tool_calls"


def test_glm45_parser_on_glm47_output() -> None:
    """glm45 on GLM-4.7 markup (no newline after the name): the call disappears, stream and not."""
    msg, streamed = _weather("glm47", "glm45")
    assert (msg.finish_reason, msg.tool_calls, msg.content) == ("stop", [], "")
    assert (streamed.content.strip(), streamed.calls, streamed.finish) == ("", [], "stop")


def test_glm47_parser_on_glm45_output_differs_between_stream_and_not() -> None:
    """glm47 on GLM-4.5 markup: the name keeps its newline and is dropped, yet streaming parses it."""
    msg, streamed = _weather("glm45", "glm47")
    assert (msg.finish_reason, msg.tool_calls) == ("stop", [])
    assert [(n, json.loads(a)) for n, a in streamed.calls] == [("get_weather", {"city": "Oslo"})]


def test_qwen25_parser_on_hermes_output_passes_through() -> None:
    """qwen25 needs `<tool_call>` plus newline, so Hermes markup stays raw content."""
    msg, streamed = _weather("hermes", "qwen25")
    assert (msg.finish_reason, msg.tool_calls) == ("stop", []) and LEAK["hermes"] in (msg.content or "")
    assert LEAK["hermes"] in streamed.content and "</tool_call>" not in streamed.content


def test_two_cities_two_calls_with_distinct_ids() -> None:
    """Two cities give calls 0 and 1 with distinct ids, stream and not."""
    tokens = _tokens("qwen25", "Weather in Paris and Oslo?", TOOLS, QUIET)
    msg, streamed = _both(tokens, "qwen25", None, QUIET, interval=3)
    assert [json.loads(c.arguments)["city"] for c in msg.tool_calls] == ["Paris", "Oslo"]
    assert [c.index for c in msg.tool_calls] == [0, 1] and len({c.id for c in msg.tool_calls}) == 2
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in msg.tool_calls)
    assert [json.loads(a)["city"] for _, a in streamed.calls] == ["Paris", "Oslo"] and len(
        set(streamed.ids)
    ) == 2


def test_kimi_ids_name_the_function() -> None:
    """kimi_k2 call ids are functions.NAME:N, stream and not."""
    msg, streamed = _weather("kimi_k2", "kimi_k2")
    assert [c.id for c in msg.tool_calls] == ["functions.get_weather:0"] and streamed.ids == [
        "functions.get_weather:0"
    ]


def test_ids_are_deterministic() -> None:
    """The same output gives the same call ids."""
    assert _weather("glm45", "glm45")[0] == _weather("glm45", "glm45")[0]


@pytest.mark.parametrize(
    ("family", "reasoning", "kwargs"),
    [
        ("kimi_k2", "kimi_k2", None),
        ("deepseekv31", "deepseek-v3", {"thinking": True}),
        ("qwen25", "qwen3", None),
        ("glm45", "glm45", None),
        ("glm47", "glm45", None),
    ],
)
@pytest.mark.parametrize("interval", [1, 5])
def test_matching_reasoning_parser_separates_thinking(
    family: str, reasoning: str, kwargs: dict[str, Any] | None, interval: int
) -> None:
    """The matching reasoning parser puts the thinking in reasoning_content and 42 in content."""
    msg, streamed = _both(_tokens(family, "What is 17+25?", None, kwargs), None, reasoning, kwargs, interval)
    assert msg.reasoning_content and "think>" not in msg.reasoning_content
    assert (msg.content or "").strip() == "42" and msg.finish_reason == "stop"
    assert streamed.reasoning.strip() == msg.reasoning_content.strip() and streamed.content.strip() == "42"


@pytest.mark.parametrize(("family", "kwargs"), [("kimi_k2", None), ("qwen25", None), ("glm45", None)])
@pytest.mark.parametrize("reasoning", [None, "kimi", "mistral"])
def test_missing_or_foreign_reasoning_parser_leaks_think_block(
    family: str, kwargs: dict[str, Any] | None, reasoning: str | None
) -> None:
    """No reasoning parser, `kimi` on `<think>` output or an unknown one: the think block is content."""
    msg, streamed = _both(_tokens(family, "What is 17+25?", None, kwargs), None, reasoning, kwargs)
    assert (
        msg.reasoning_content is None
        and "<think>" in (msg.content or "")
        and "</think>" in (msg.content or "")
    )
    assert streamed.reasoning == "" and "</think>" in streamed.content


def test_v31_thinking_without_parser_leaks_only_closing_tag() -> None:
    """V3.1's template opens the think block, so a missing parser leaks `…</think>answer`."""
    msg, _ = _both(_tokens("deepseekv31", "What is 17+25?", None, {"thinking": True}), None, None, None)
    assert msg.content is not None and "<think>" not in msg.content and msg.content.endswith("</think>42")


def test_forced_reasoning_on_non_thinking_model_swallows_answer() -> None:
    """qwen3 on Qwen2.5 (no think block) forces reasoning: the answer lands in reasoning_content."""
    req = ChatRequest([{"role": "user", "content": "What is 17+25?"}], None, "none", 64, None, 0.0)
    tokens = generate_chat("qwen25", "Qwen/Qwen2.5-7B-Instruct", req, 0)[0]
    msg, streamed = _both(tokens, None, "qwen3", None)
    assert (msg.content, msg.reasoning_content) == ("", "42") and streamed.reasoning == "42"


def test_reasoning_parser_with_thinking_off_leaves_answer_in_content() -> None:
    """Thinking switched off: nothing is forced and the answer stays content."""
    kwargs = {"enable_thinking": False}
    msg, _ = _both(_tokens("qwen25", "What is 17+25?", None, kwargs), None, "qwen3", kwargs)
    assert (msg.content, msg.reasoning_content) == ("42", None)


def test_thinking_then_tool_call_with_both_parsers() -> None:
    """Reasoning first, then the call: both parsers together give reasoning and the call."""
    tokens = _tokens("kimi_k2", "What is the weather in Lima?", TOOLS, None)
    msg, streamed = _both(tokens, "kimi_k2", "kimi_k2", None, interval=2)
    assert msg.reasoning_content and "Lima" in msg.reasoning_content
    assert [json.loads(c.arguments) for c in msg.tool_calls] == [{"city": "Lima"}] and msg.content == ""
    assert streamed.reasoning == msg.reasoning_content and streamed.finish == "tool_calls"


def test_tool_choice_none_and_no_tools_skip_tool_parsing() -> None:
    """With tool_choice none or no tools the tool parser does not run: markup stays content."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for tools, choice in ((TOOLS, "none"), (None, "auto")):
        msg = parse_complete(
            text,
            tool_parser="qwen25",
            reasoning_parser=None,
            tools=tools,
            tool_choice=choice,
            raw_finish_reason="stop",
            chat_template_kwargs=None,
        )
        assert (msg.content, msg.tool_calls, msg.finish_reason) == (text, [], "stop")


def test_length_finish_is_kept() -> None:
    """A cut output keeps finish_reason length even with a parsed call."""
    tokens = _tokens("kimi_k2", "What is the weather in Oslo?", TOOLS, QUIET)
    msg = parse_complete(
        "".join(tokens),
        tool_parser="kimi_k2",
        reasoning_parser=None,
        tools=TOOLS,
        tool_choice="auto",
        raw_finish_reason="length",
        chat_template_kwargs=None,
    )
    assert msg.finish_reason == "length"


def test_chunk_tokens_groups_by_stream_interval() -> None:
    """Chunks join stream_interval tokens each; the last one may be shorter."""
    assert chunk_tokens(["a", "b", "c", "d", "e"], 2) == ["ab", "cd", "e"]
    assert chunk_tokens(["a", "b"], 0) == ["a", "b"]


@pytest.mark.parametrize("family", ["deepseekv3", "deepseekv31"])
def test_deepseek_stream_sends_empty_arguments_when_the_call_ends_the_last_chunk(family: str) -> None:
    """As SGLang 0.5.23: a DeepSeek call whose name and arguments come in the last chunk streams "{}"."""
    tokens = _tokens(family, "What is the weather in Oslo?", TOOLS, QUIET)
    msg, streamed = _both(tokens, family, None, QUIET, interval=len(tokens))
    assert [json.loads(c.arguments) for c in msg.tool_calls] == [{"city": "Oslo"}]
    assert streamed.calls == [("get_weather", "{}")] and streamed.finish == "tool_calls"
