"""Model family → the tool-call and reasoning parsers SGLang should be launched with (parsers.md §1–§2).

The parser names are those of SGLang 0.5.23 (`reference/sglang-0.5.23-markers.json`). A family is
recognised from any component of the model path (last component first), so Hugging Face ids
(`moonshotai/Kimi-K2.5`), local directories and hub-cache paths (`models--deepseek-ai--DeepSeek-V3.1/
snapshots/<hash>`) all resolve. More specific families are listed before the general ones.
"""

from __future__ import annotations

import re
from typing import NamedTuple

TOOL_PARSERS: frozenset[str] = frozenset(
    [
        "apertus2509",
        "beam",
        "cohere_command4",
        "deepseekv3",
        "deepseekv31",
        "deepseekv32",
        "deepseekv4",
        "deepseekv41",
        "dots",
        "gemma4",
        "gigachat3",
        "gigachat35",
        "glm",
        "glm45",
        "glm47",
        "gpt-oss",
        "hermes",
        "hunyuan",
        "inkling",
        "interns1",
        "iquest_q1",
        "k2_horizon",
        "kimi_k2",
        "kimi_k3",
        "lfm2",
        "ling3",
        "llama3",
        "mimo",
        "minicpm5",
        "minimax-m2",
        "minimax-m3",
        "mistral",
        "muse",
        "nanbeige",
        "poolside_v1",
        "pythonic",
        "qwen",
        "qwen25",
        "qwen3_coder",
        "response_template",
        "spark25",
        "step3",
        "step3p5",
        "trinity",
    ]
)
REASONING_PARSERS: frozenset[str] = frozenset(
    [
        "apertus2509",
        "beam",
        "cohere_command4",
        "deepseek-r1",
        "deepseek-v3",
        "deepseek-v4",
        "deepseek-v41",
        "dots",
        "gemma4",
        "gigachat35",
        "glm45",
        "gpt-oss",
        "granite_thinking_parser",
        "hunyuan",
        "inkling",
        "interns1",
        "iquest_q1",
        "k2_horizon",
        "kimi",
        "kimi_k2",
        "kimi_k3",
        "ling3",
        "mimo",
        "minimax",
        "minimax-append-think",
        "minimax-m3",
        "mistral",
        "muse",
        "nanbeige",
        "nemotron_3",
        "poolside_v1",
        "qwen3",
        "qwen3-thinking",
        "response_template",
        "step3",
        "step3p5",
    ]
)


class ExpectedParsers(NamedTuple):
    """`--tool-call-parser` and `--reasoning-parser` for a family; None = the flag should be unset."""

    tool: str | None
    reasoning: str | None


_S = r"[-_. ]?"  # how model names separate their parts

# (pattern, family, tool parser, reasoning parser), most specific first.
FAMILIES: tuple[tuple[str, str, str | None, str | None], ...] = (
    (rf"kimi{_S}k2{_S}thinking", "kimi-k2-thinking", "kimi_k2", "kimi_k2"),
    (rf"kimi{_S}k2{_S}5", "kimi-k2.5", "kimi_k2", "kimi_k2"),
    (rf"kimi{_S}k2", "kimi-k2", "kimi_k2", None),
    (rf"deepseek{_S}r1{_S}distill", "deepseek-r1-distill", None, "deepseek-r1"),
    (rf"deepseek{_S}r1", "deepseek-r1", "deepseekv3", "deepseek-r1"),
    (rf"deepseek{_S}v4{_S}1", "deepseek-v4.1", "deepseekv41", "deepseek-v41"),
    (rf"deepseek{_S}v4", "deepseek-v4", "deepseekv4", "deepseek-v4"),
    (rf"deepseek{_S}v3{_S}2{_S}exp", "deepseek-v3.2-exp", "deepseekv31", "deepseek-v3"),
    (rf"deepseek{_S}v3{_S}2", "deepseek-v3.2", "deepseekv32", "deepseek-v3"),
    (rf"deepseek{_S}v3{_S}1", "deepseek-v3.1", "deepseekv31", "deepseek-v3"),
    (rf"deepseek{_S}v3", "deepseek-v3", "deepseekv3", None),
    (rf"qwen3{_S}coder", "qwen3-coder", "qwen3_coder", None),
    (r"qwen3[-_.]5", "qwen3.5", "qwen3_coder", "qwen3"),
    (r"qwen3.*thinking", "qwen3-thinking-2507", "qwen", "qwen3-thinking"),
    (rf"qwen3.*instruct{_S}2507", "qwen3-instruct-2507", "qwen", None),
    (r"qwen3", "qwen3", "qwen", "qwen3"),
    (r"qwq", "qwq", "qwen", "qwen3"),
    (rf"qwen2{_S}5", "qwen2.5", "qwen", None),
    (rf"glm{_S}4{_S}7", "glm-4.7", "glm47", "glm45"),
    (rf"glm{_S}5", "glm-5", "glm47", "glm45"),
    (rf"glm{_S}4{_S}[56]", "glm-4.5", "glm45", "glm45"),
    (rf"minimax{_S}m3", "minimax-m3", "minimax-m3", "minimax-m3"),
    (rf"minimax{_S}m2", "minimax-m2", "minimax-m2", "minimax"),
    (rf"gpt{_S}oss", "gpt-oss", "gpt-oss", "gpt-oss"),
    (rf"magistral|mistral{_S}small{_S}4", "magistral", "mistral", "mistral"),
    (r"mistral|ministral|devstral", "mistral", "mistral", None),
    (rf"llama{_S}4", "llama-4", "pythonic", None),
    (rf"llama{_S}3", "llama-3", "llama3", None),
)
_COMPILED = tuple((re.compile(p), ExpectedParsers(t, r)) for p, _, t, r in FAMILIES)


def expected_parsers(model_path: str) -> ExpectedParsers | None:
    """`(tool, reasoning)` parsers for the model's family, or None when the family is unknown."""
    for component in reversed([c for c in re.split(r"[/\\]", model_path.lower()) if c]):
        for pattern, parsers in _COMPILED:
            if pattern.search(component):
                return parsers
    return None


# `--tool-call-parser` names that SGLang 0.5.23 serves with one detector built the same way, → one name for them:
# the deprecated `qwen25` and `glm45` (rewritten to `qwen` and `glm` at startup, so `/server_info` reports the new
# name), and the other keys of the Qwen3-Coder XML detector. Reasoning parser names have no such aliases: names
# that share a detector class differ in when reasoning is forced on.
_SAME_TOOL = {"qwen25": "qwen", "glm45": "glm", "step3p5": "qwen3_coder", "nanbeige": "qwen3_coder"}


def parsers_match(expected: str | None, actual: str | None, *, reasoning: bool = False) -> bool:
    """True when two `--tool-call-parser` (or, with `reasoning`, `--reasoning-parser`) settings parse alike.

    Aliases agree (`qwen25` and `qwen`, `glm45` and `glm`); None (the flag unset) matches only None.
    """
    if reasoning:
        return expected == actual
    return _SAME_TOOL.get(expected or "", expected) == _SAME_TOOL.get(actual or "", actual)
