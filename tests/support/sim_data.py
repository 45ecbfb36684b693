"""Data shared by the simulator's tests: one model path per family and the canary's weather tool."""

from __future__ import annotations

from typing import Any

MODELS = {
    "kimi_k2": "moonshotai/Kimi-K2.5",
    "deepseekv3": "deepseek-ai/DeepSeek-V3-0324",
    "deepseekv31": "deepseek-ai/DeepSeek-V3.1",
    "qwen25": "Qwen/Qwen3-8B",
    "glm45": "zai-org/GLM-4.5",
    "glm47": "zai-org/GLM-4.7",
    "hermes": "NousResearch/Hermes-3-Llama-3.1-8B",
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
