"""`--tool-call-parser` and `--reasoning-parser` names → the detectors and reasoning formats of the families."""

from __future__ import annotations

from simulator.parsers import deepseek, glm, kimi, qwen
from simulator.parsers.base import ToolDetector
from simulator.parsers.reasoning import ReasoningFormat

_QWEN25 = qwen.Qwen25Detector()
_GLM45 = glm.Glm45Detector()
TOOL_PARSERS: dict[str, ToolDetector] = {
    "kimi_k2": kimi.KimiK2Detector(),
    "deepseekv3": deepseek.DeepSeekV3Detector(),
    "deepseekv31": deepseek.DeepSeekV31Detector(),
    "qwen25": _QWEN25,
    "qwen": _QWEN25,
    "hermes": qwen.HermesDetector(),
    "glm45": _GLM45,
    "glm": _GLM45,
    "glm47": glm.Glm47Detector(),
}
REASONING_PARSERS: dict[str, ReasoningFormat] = {
    "kimi_k2": kimi.KIMI_K2_REASONING,
    "kimi": kimi.KIMI_REASONING,
    "deepseek-r1": deepseek.DEEPSEEK_R1_REASONING,
    "deepseek-v3": deepseek.DEEPSEEK_V3_REASONING,
    "qwen3": qwen.QWEN3_REASONING,
    "qwen3-thinking": qwen.QWEN3_THINKING_REASONING,
    "glm45": glm.GLM45_REASONING,
}


def tool_detector(name: str | None) -> ToolDetector | None:
    """The detector of a `--tool-call-parser` name (None when unset or unknown: nothing is parsed)."""
    return TOOL_PARSERS.get(name) if name else None


def reasoning_format(name: str | None) -> ReasoningFormat | None:
    """The format of a `--reasoning-parser` name (None when unset or unknown: nothing is split)."""
    return REASONING_PARSERS.get(name) if name else None
