"""The simulator's markup, parsed by real SGLang 0.5.23's own detectors, gives what our parsers give.

One subprocess in the real SGLang venv parses every case (non-stream and stream over our chunking) with
`FunctionCallParser` and `ReasoningParser`; the test compares each result with `parse_complete` and
`StreamParser` on the same text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simulator.families import ChatRequest, generate_chat
from simulator.parsers.chat import StreamParser, chunk_tokens, parse_complete
from tests.support.real_sglang import run_real_script

_RESULT = "REAL-PARSERS-RESULT "
_TOOL_PARSERS = ("kimi_k2", "deepseekv3", "deepseekv31", "qwen25", "hermes", "glm45", "glm47")
_REASONING_PARSERS = (
    "kimi_k2",
    "deepseek-r1",
    "deepseek-v3",
    "qwen3",
    "qwen3-thinking",
    "glm45",
    "kimi",
    None,
)
_MODELS = {
    "kimi_k2": ("moonshotai/Kimi-K2.5", "kimi_k2", {"thinking": False}),
    "deepseekv3": ("deepseek-ai/DeepSeek-V3-0324", None, None),
    "deepseekv31": ("deepseek-ai/DeepSeek-V3.1", "deepseek-v3", {"thinking": True}),
    "qwen25": ("Qwen/Qwen3-8B", "qwen3", {"enable_thinking": False}),
    "glm45": ("zai-org/GLM-4.5", "glm45", {"enable_thinking": False}),
    "glm47": ("zai-org/GLM-4.7", "glm45", None),
    "hermes": ("NousResearch/Hermes-3-Llama-3.1-8B", None, None),
}
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

# Runs inside the real SGLang venv. Reasoning is forced as serving_chat does without a chat template:
# from the detector's own reasoning_default and the request's chat_template_kwargs.
_SCRIPT = """
import json, logging
logging.disable(logging.CRITICAL)
from sglang.srt.entrypoints.openai.protocol import Function, Tool
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser

def forced(name, kwargs):
    mode = ReasoningParser(name).detector.reasoning_default
    if mode == "always":
        return True
    if mode in ("thinking", "enable_thinking"):
        return kwargs.get(mode) is not False
    if mode.startswith("explicit_"):
        return kwargs.get(mode[len("explicit_"):]) is True
    return False

def run(case):
    tools = [Tool(type="function", function=Function(**t["function"])) for t in case["tools"]]
    kwargs = case["kwargs"] or {}
    rname, tname = case["reasoning_parser"], case["tool_parser"]
    text, reasoning = case["text"], None
    if rname:
        reasoning, text = ReasoningParser(rname, False, forced(rname, kwargs)).parse_non_stream(text)
    calls = []
    parser = FunctionCallParser(tools, tname)
    if parser.has_tool_call(text):
        text, items = parser.parse_non_stream(text)
        calls = [[c.name, c.parameters] for c in items]
    out = {"content": text or "", "reasoning": reasoning or None, "calls": calls}
    stream_parser = ReasoningParser(rname, True, forced(rname, kwargs)) if rname else None
    parser = FunctionCallParser(tools, tname)
    content, thought, streamed = "", "", {}
    for i, chunk in enumerate(case["chunks"]):
        last = i == len(case["chunks"]) - 1
        normal = chunk
        if stream_parser:
            r, normal = stream_parser.parse_stream_chunk(chunk)
            thought += r or ""
            if last:
                r2, n2 = stream_parser.parse_stream_end()
                thought += r2 or ""
                normal = (normal or "") + (n2 or "")
        n, items = parser.parse_stream_chunk(normal or "")
        content += n or ""
        if last:
            n2, more = parser.parse_stream_end()
            content += n2 or ""
            items = list(items) + list(more)
        for item in items:
            entry = streamed.setdefault(str(item.tool_index), ["", ""])
            entry[0] = entry[0] or (item.name or "")
            entry[1] += item.parameters or ""
    det = parser.detector
    if det.prev_tool_call_arr and det.streamed_args_for_tool:
        idx = len(det.prev_tool_call_arr) - 1
        if idx < len(det.streamed_args_for_tool):
            expected = det.prev_tool_call_arr[idx].get("arguments", {})
            expected = expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)
            sent = det.streamed_args_for_tool[idx]
            if expected.startswith(sent) and expected != sent:
                streamed.setdefault(str(idx), ["", ""])[1] += expected[len(sent):]
    out["stream"] = {"content": content, "reasoning": thought or None,
                     "calls": [streamed[k] for k in sorted(streamed, key=int)]}
    return out

with open(CASES_PATH, encoding="utf-8") as f:
    cases = json.load(f)
print(RESULT + json.dumps([run(c) for c in cases]))
"""


def _cases() -> list[dict[str, Any]]:
    """Every family's markup, thinking on and off: with tools through every tool parser, without
    tools through every reasoning parser."""
    cases: list[dict[str, Any]] = []
    for family, (model, reasoning_parser, quiet) in _MODELS.items():
        for kwargs in (quiet, None) if quiet is not None else (None,):
            for prompt in ("What is the weather in Oslo?", "What is the weather in Paris and Lima?"):
                req = ChatRequest([{"role": "user", "content": prompt}], _TOOLS, "auto", 512, kwargs, 0.0)
                tokens, _ = generate_chat(family, model, req, seed=7)
                for tool_parser in _TOOL_PARSERS:
                    cases.append(
                        {
                            "family": family,
                            "text": "".join(tokens),
                            "chunks": chunk_tokens(tokens, 1 if len(cases) % 2 else 3),
                            "tool_parser": tool_parser,
                            "reasoning_parser": reasoning_parser,
                            "kwargs": kwargs,
                            "tools": _TOOLS,
                        }
                    )
            req = ChatRequest([{"role": "user", "content": "What is 17+25?"}], None, "none", 512, kwargs, 0.0)
            tokens, _ = generate_chat(family, model, req, seed=7)
            for other in _REASONING_PARSERS:
                cases.append(
                    {
                        "family": family,
                        "text": "".join(tokens),
                        "chunks": chunk_tokens(tokens, 1 if len(cases) % 2 else 2),
                        "tool_parser": "qwen25",
                        "reasoning_parser": other,
                        "kwargs": kwargs,
                        "tools": [],
                    }
                )
    return cases


def _ours(case: dict[str, Any]) -> dict[str, Any]:
    """Our parsers on one case, shaped like the script's result."""
    common: dict[str, Any] = {
        "tool_parser": case["tool_parser"],
        "reasoning_parser": case["reasoning_parser"],
        "tools": case["tools"],
        "tool_choice": "auto",
        "chat_template_kwargs": case["kwargs"],
    }
    msg = parse_complete(case["text"], raw_finish_reason="stop", **common)
    stream = StreamParser(**common)
    deltas = [d for chunk in case["chunks"] for d in stream.feed(chunk)]
    deltas += stream.finish("stop")[0]
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", ""])
            entry[0] = entry[0] or (call["function"]["name"] or "")
            entry[1] += call["function"]["arguments"]
    return {
        "content": msg.content or "",
        "reasoning": msg.reasoning_content,
        "calls": [[c.name, c.arguments] for c in msg.tool_calls],
        "stream": {
            "content": "".join(d.get("content", "") for d in deltas),
            "reasoning": "".join(d.get("reasoning_content", "") for d in deltas) or None,
            "calls": [calls[k] for k in sorted(calls)],
        },
    }


def _comparable(result: dict[str, Any]) -> dict[str, Any]:
    """Streamed text compared without surrounding whitespace (SGLang's own stream differs there)."""
    stream = dict(result["stream"])
    stream["content"] = stream["content"].strip()
    stream["reasoning"] = (stream["reasoning"] or "").strip() or None
    return {**result, "stream": stream}


def test_simulator_markup_parses_like_real_sglang(real_python: Path, tmp_path: Path) -> None:
    """For every family and tool parser, SGLang's detectors and ours agree, non-stream and stream."""
    cases = _cases()
    cases_path = tmp_path / "cases.json"
    cases_path.write_text(json.dumps(cases), encoding="utf-8")
    script = f"RESULT = {_RESULT!r}\nCASES_PATH = {str(cases_path)!r}\n" + _SCRIPT
    out = run_real_script(real_python, script)
    line = next(x for x in out.splitlines() if x.startswith(_RESULT))
    theirs = json.loads(line[len(_RESULT) :])
    mismatches = []
    for case, real in zip(cases, theirs, strict=True):
        ours = _ours(case)
        if _comparable(ours) != _comparable(real):
            label = f"{case['family']} via {case['tool_parser']}/{case['reasoning_parser']} kwargs={case['kwargs']}"
            mismatches.append(f"{label}\n  text={case['text']!r}\n  real={real}\n  ours={ours}")
    assert not mismatches, f"{len(mismatches)} of {len(cases)} cases differ:\n" + "\n".join(mismatches)
