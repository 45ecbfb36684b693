"""Model family → expected tool-call and reasoning parsers."""

from __future__ import annotations

import json

import pytest

from policies.parsers_table import (
    FAMILIES,
    REASONING_PARSERS,
    TOOL_PARSERS,
    expected_parsers,
    parsers_match,
)
from tests.support.paths import DATA

MARKERS = DATA / "sglang-0.5.23-markers.json"


@pytest.mark.parametrize(
    ("model", "tool", "reasoning"),
    [
        ("moonshotai/Kimi-K2-Instruct", "kimi_k2", None),
        ("moonshotai/Kimi-K2-Thinking", "kimi_k2", "kimi_k2"),
        ("moonshotai/Kimi-K2.5", "kimi_k2", "kimi_k2"),
        ("deepseek-ai/DeepSeek-V3-0324", "deepseekv3", None),
        ("deepseek-ai/DeepSeek-R1-0528", "deepseekv3", "deepseek-r1"),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", "deepseekv31", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseekv31", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-V3.2", "deepseekv32", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-V4", "deepseekv4", "deepseek-v4"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen", None),
        ("Qwen/Qwen3-235B-A22B", "qwen", "qwen3"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "qwen", "qwen3-thinking"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen", None),
        ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "qwen3_coder", None),
        ("zai-org/GLM-4.5-Air", "glm45", "glm45"),
        ("zai-org/GLM-4.6", "glm45", "glm45"),
        ("zai-org/GLM-4.7", "glm47", "glm45"),
        ("zai-org/GLM-5", "glm47", "glm45"),
        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2", "minimax"),
        ("openai/gpt-oss-120b", "gpt-oss", "gpt-oss"),
        ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistral", None),
        ("mistralai/Magistral-Small-2509", "mistral", "mistral"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama3", None),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "pythonic", None),
    ],
)
def test_known_families(model: str, tool: str | None, reasoning: str | None) -> None:
    """Each family in parsers.md maps to its documented parsers."""
    assert expected_parsers(model) == (tool, reasoning)


def test_local_and_hub_cache_paths_resolve() -> None:
    """Local directories and hub-cache snapshot paths resolve by their named component."""
    assert expected_parsers("/models/deepseek_v3_1/") == ("deepseekv31", "deepseek-v3")
    assert expected_parsers("/hf/models--moonshotai--Kimi-K2.5/snapshots/0123abcd") == ("kimi_k2", "kimi_k2")


def test_unknown_model_has_no_expectation() -> None:
    """An unknown model yields None, so no parser check is made."""
    assert expected_parsers("/models/my-finetune") is None
    assert expected_parsers("") is None


def test_table_names_only_known_parsers() -> None:
    """Every parser in the table is a parser SGLang knows."""
    for _, _, tool, reasoning in FAMILIES:
        assert tool is None or tool in TOOL_PARSERS
        assert reasoning is None or reasoning in REASONING_PARSERS


@pytest.mark.skipif(not MARKERS.is_file(), reason="SGLang 0.5.23 markers (shared reference) not present")
def test_parser_names_match_sglang_0_5_23() -> None:
    """The name sets equal the parsers listed in the SGLang 0.5.23 markers file."""
    data = json.loads(MARKERS.read_text())
    assert set(data["tool_call_parsers"]) == TOOL_PARSERS
    assert set(data["reasoning_parsers"]) == REASONING_PARSERS


def test_parser_aliases_match() -> None:
    """Aliases of one detector match each other; different parsers and unset do not."""
    assert parsers_match("qwen", "qwen25")
    assert parsers_match("glm", "glm45")
    assert parsers_match(None, None)
    assert not parsers_match("qwen", "hermes")
    assert not parsers_match("kimi_k2", None)
