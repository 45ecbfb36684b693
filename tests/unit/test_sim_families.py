"""The simulator's model: family detection, expected parsers and the raw markup it writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from simulator.families import (
    FAMILIES,
    ChatRequest,
    detect_family,
    expected_parsers,
    generate_chat,
    generate_text,
    tokenize,
)
from tests.support.sim_data import MODELS

WEATHER: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city", "unit"],
            },
        },
    }
]


def _req(prompt: str, tools: list[dict[str, Any]] | None = None, **kw: object) -> ChatRequest:
    return ChatRequest(
        messages=[{"role": "user", "content": prompt}],
        tools=tools,
        tool_choice=kw.get("tool_choice", "auto" if tools else "none"),
        max_tokens=int(kw.get("max_tokens", 512)),  # type: ignore[call-overload]
        chat_template_kwargs=kw.get("kwargs"),  # type: ignore[arg-type]
        temperature=0.0,
    )


@pytest.mark.parametrize(
    ("path", "family"),
    [
        ("moonshotai/Kimi-K2.5", "kimi_k2"),
        ("moonshotai/Kimi-K2-Instruct-0905", "kimi_k2"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseekv3"),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseekv31"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseekv31"),
        ("Qwen/Qwen3-235B-A22B", "qwen25"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen25"),
        ("zai-org/GLM-4.6", "glm45"),
        ("zai-org/GLM-4.7", "glm47"),
        ("/models/unknown-model", "qwen25"),
    ],
)
def test_detect_family_from_model_path(path: str, family: str) -> None:
    """A model path maps to the family whose markup the model writes."""
    assert detect_family(path) == family
    assert family in FAMILIES


def test_detect_family_override_wins_and_is_checked() -> None:
    """The override names the family; an unknown one is refused."""
    assert detect_family("Qwen/Qwen3-8B", "glm45") == "glm45"
    with pytest.raises(ValueError, match="unknown model family"):
        detect_family("Qwen/Qwen3-8B", "llama")


@pytest.mark.parametrize(
    ("path", "parsers"),
    [
        ("moonshotai/Kimi-K2.5", ("kimi_k2", "kimi_k2")),
        ("deepseek-ai/DeepSeek-V3-0324", ("deepseekv3", None)),
        ("deepseek-ai/DeepSeek-V3.1", ("deepseekv31", "deepseek-v3")),
        ("Qwen/Qwen3-8B", ("qwen25", "qwen3")),
        ("Qwen/Qwen2.5-7B-Instruct", ("qwen25", None)),
        ("zai-org/GLM-4.5", ("glm45", "glm45")),
    ],
)
def test_expected_parsers_per_model(path: str, parsers: tuple[str | None, str | None]) -> None:
    """Each model names the tool and reasoning parser a correct launch uses."""
    assert expected_parsers(path, detect_family(path)) == parsers


@pytest.mark.parametrize("family", FAMILIES)
def test_tool_request_calls_first_tool_with_city_from_prompt(family: str) -> None:
    """With tools, the markup holds one call of the first tool with the prompt's city."""
    quiet = {"thinking": False, "enable_thinking": False}
    req = _req("What is the weather in Oslo?", WEATHER, kwargs=quiet)
    tokens, finish = generate_chat(family, MODELS[family], req, 3)
    text = "".join(tokens)
    assert finish == "stop"
    assert "get_weather" in text and "Oslo" in text
    assert text.count("Oslo") == 1


def test_two_cities_give_two_calls() -> None:
    """Two cities in the prompt give two calls, each with its city and the other required params."""
    req = _req("What is the weather in Paris and Oslo?", WEATHER, kwargs={"enable_thinking": False})
    text = "".join(generate_chat("qwen25", MODELS["qwen25"], req, 0)[0])
    bodies = [json.loads(b) for b in text.replace("<tool_call>\n", "").split("\n</tool_call>") if b.strip()]
    assert [b["arguments"] for b in bodies] == [{"city": "Paris", "unit": "c"}, {"city": "Oslo", "unit": "c"}]


@pytest.mark.parametrize("family", FAMILIES)
def test_arithmetic_answer_without_tools(family: str) -> None:
    """Without tools the model answers; "What is 17+25?" ends in 42."""
    tokens, finish = generate_chat(family, MODELS[family], _req("What is 17+25?"), 1)
    assert finish == "stop"
    assert "".join(tokens).endswith("42")


@pytest.mark.parametrize(
    ("family", "kwargs", "thinks"),
    [
        ("kimi_k2", None, True),
        ("kimi_k2", {"thinking": False}, False),
        ("deepseekv31", None, False),
        ("deepseekv31", {"thinking": True}, True),
        ("qwen25", None, True),
        ("qwen25", {"enable_thinking": False}, False),
        ("glm45", {"enable_thinking": False}, False),
        ("deepseekv3", {"thinking": True}, False),
    ],
)
def test_reasoning_block_follows_the_family_switch(
    family: str, kwargs: dict[str, bool] | None, thinks: bool
) -> None:
    """Each family thinks by default or only on request, as its chat template does."""
    text = "".join(generate_chat(family, MODELS[family], _req("What is 17+25?", kwargs=kwargs), 0)[0])
    assert ("</think>" in text) is thinks


def test_qwen25_paths_never_think() -> None:
    """A Qwen2.5 model writes no reasoning block."""
    text = "".join(generate_chat("qwen25", "Qwen/Qwen2.5-7B-Instruct", _req("What is 17+25?"), 0)[0])
    assert text == "42"


def test_max_tokens_cuts_with_length() -> None:
    """An output longer than max_tokens is cut there with finish reason length."""
    tokens, finish = generate_chat("kimi_k2", MODELS["kimi_k2"], _req("What is 17+25?", max_tokens=5), 0)
    assert (len(tokens), finish) == (5, "length")


def test_generation_is_deterministic_for_seed() -> None:
    """The same request and seed give the same tokens."""
    req = _req("Tell me something.")
    assert generate_chat("glm45", MODELS["glm45"], req, 9) == generate_chat("glm45", MODELS["glm45"], req, 9)
    assert generate_text("hello", 20, 4) == generate_text("hello", 20, 4)


def test_markers_are_single_tokens() -> None:
    """Every family marker is one token; text is split into word-ish pieces."""
    tokens = tokenize("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0", "kimi_k2")
    assert tokens[:2] == ["<|tool_calls_section_begin|>", "<|tool_call_begin|>"]
    assert "".join(tokens[2:]) == "functions.get_weather:0" and len(tokens) > 3


def test_generate_text_respects_max_new_tokens() -> None:
    """/generate text never exceeds max_new_tokens and is plain text."""
    assert len(generate_text("The capital of France is", 1, 0)) == 1
    tokens = generate_text("The capital of France is", 64, 0)
    assert 1 < len(tokens) <= 64 and "<" not in "".join(tokens)
