"""OpenAI-compatible bodies of the simulator: SGLang's shapes, accepted by the `openai` client's models."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from simulator.families import FAMILIES, ChatRequest, detect_family, expected_parsers, generate_chat
from simulator.openai_api import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    chat_chunk,
    chat_completion,
    parse_chat_request,
    usage_chunk,
)
from simulator.parsers.chat import StreamParser, chunk_tokens, parse_complete
from tests.support.sim_data import MODELS, TOOLS

SERVED = "sim/model"


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED,
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        **extra,
    }


def test_valid_request_defaults() -> None:
    """A minimal body gives tool_choice none, the default max_tokens and temperature 1."""
    req = parse_chat_request(_body())
    assert isinstance(req, ChatRequest)
    assert (req.tool_choice, req.max_tokens, req.temperature, req.tools) == (
        "none",
        DEFAULT_MAX_TOKENS,
        1.0,
        None,
    )


def test_tools_default_to_auto_and_fields_carry_over() -> None:
    """With tools tool_choice defaults to auto; max_completion_tokens and template kwargs carry over."""
    body = _body(
        tools=TOOLS, max_completion_tokens=64, temperature=0, chat_template_kwargs={"thinking": False}
    )
    req = parse_chat_request(body)
    assert isinstance(req, ChatRequest)
    assert (req.tool_choice, req.max_tokens, req.temperature) == ("auto", 64, 0.0)
    assert req.chat_template_kwargs == {"thinking": False} and req.tools == TOOLS


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": SERVED}, "Messages cannot be empty."),
        ({"model": SERVED, "messages": []}, "Messages cannot be empty."),
        ({"model": SERVED, "messages": [{"content": "hi"}]}, "needs a role"),
        (_body(tool_choice="required"), "Tools cannot be empty if tool choice is set to required."),
        (
            _body(tool_choice={"type": "function", "function": {"name": "x"}}, tools=TOOLS),
            "Tool 'x' not found",
        ),
        (_body(tool_choice="sometimes", tools=TOOLS), "Invalid tool_choice"),
        (_body(max_tokens=0), "max_tokens must be a positive integer."),
        (_body(temperature=-1), "temperature must be a number"),
        (_body(tools=[{"type": "function"}]), "function.name is required"),
        (_body(chat_template_kwargs=[1]), "chat_template_kwargs must be an object."),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_invalid_bodies_get_sglang_400(body: object, message: str) -> None:
    """Invalid bodies get 400 with SGLang's ErrorResponse shape."""
    err = parse_chat_request(body)
    assert isinstance(err, ApiError) and err.status == 400
    assert set(err.body) == {"object", "message", "type", "param", "code"}
    assert err.body["object"] == "error" and err.body["code"] == 400 and message in err.body["message"]


def test_any_model_name_is_served_as_sglang_0_5_23_does() -> None:
    """The request's model name is ignored (the real server answers 200 for a name it does not serve)."""
    assert isinstance(parse_chat_request(_body(model="gpt-4")), ChatRequest)
    assert isinstance(parse_chat_request(_body(model="default")), ChatRequest)


def _outputs(
    family: str, tools: bool, parsers: tuple[str | None, str | None]
) -> tuple[list[str], str, ChatRequest]:
    prompt = "What is the weather in Paris and Oslo?" if tools else "What is 17+25?"
    req = ChatRequest([{"role": "user", "content": prompt}], TOOLS if tools else None, "auto", 256, None, 0.0)
    tokens, finish = generate_chat(family, MODELS[family], req, 1)
    return tokens, finish, req


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tools", [True, False])
@pytest.mark.parametrize("configured", [True, False])
def test_bodies_validate_with_openai_models(family: str, tools: bool, configured: bool) -> None:
    """Completion, every stream chunk and the usage chunk validate as the openai client's models."""
    parsers = expected_parsers(MODELS[family], detect_family(MODELS[family])) if configured else (None, None)
    tokens, finish, req = _outputs(family, tools, parsers)
    common: dict[str, Any] = {
        "tool_parser": parsers[0],
        "reasoning_parser": parsers[1],
        "tools": req.tools,
        "tool_choice": req.tool_choice,
        "chat_template_kwargs": None,
    }
    msg = parse_complete("".join(tokens), raw_finish_reason=finish, **common)
    body = chat_completion("chatcmpl-1", SERVED, 1700000000, msg, 20, len(tokens))
    parsed = ChatCompletion.model_validate(body)
    assert parsed.choices[0].finish_reason == msg.finish_reason
    assert parsed.usage is not None and parsed.usage.total_tokens == 20 + len(tokens)
    stream = StreamParser(**common)
    deltas = [{"role": "assistant", "content": ""}]
    deltas += [d for c in chunk_tokens(tokens, 2) for d in stream.feed(c)]
    tail, stream_finish = stream.finish(finish)
    chunks = [chat_chunk("chatcmpl-1", SERVED, 1700000000, d, None) for d in deltas + tail]
    chunks.append(chat_chunk("chatcmpl-1", SERVED, 1700000000, {}, stream_finish))
    chunks.append(usage_chunk("chatcmpl-1", SERVED, 1700000000, 20, len(tokens)))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    assert chunks[-2]["choices"][0]["finish_reason"] == stream_finish


def test_same_family_mismatch_reports_empty_tool_calls_list() -> None:
    """A recognised marker with nothing parsed gives tool_calls [] and finish_reason tool_calls."""
    tokens, finish, req = _outputs("deepseekv31", True, ("deepseekv3", None))
    msg = parse_complete(
        "".join(tokens),
        tool_parser="deepseekv3",
        reasoning_parser=None,
        tools=req.tools,
        tool_choice="auto",
        raw_finish_reason=finish,
        chat_template_kwargs=None,
    )
    choice = chat_completion("c", SERVED, 0, msg, 1, 1)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
    assert "<｜tool▁calls▁begin｜>" in choice["message"]["content"]


def test_plain_answer_has_null_tool_calls_and_reasoning() -> None:
    """Without calls or reasoning, tool_calls and reasoning_content are null and content is text."""
    tokens, finish, _ = _outputs("deepseekv3", False, (None, None))
    msg = parse_complete(
        "".join(tokens),
        tool_parser="deepseekv3",
        reasoning_parser=None,
        tools=None,
        tool_choice="none",
        raw_finish_reason=finish,
        chat_template_kwargs=None,
    )
    message = chat_completion("c", SERVED, 0, msg, 1, 1)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "42", "reasoning_content": None, "tool_calls": None}


def test_chunk_and_usage_shapes() -> None:
    """A chunk carries one choice with a full delta; the usage chunk has no choices."""
    chunk = chat_chunk("c", SERVED, 5, {"content": "4"}, None)
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"] == {
        "role": None,
        "content": "4",
        "reasoning_content": None,
        "tool_calls": None,
    }
    usage = usage_chunk("c", SERVED, 5, 3, 4)
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 7
