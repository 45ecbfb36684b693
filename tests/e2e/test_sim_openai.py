"""The `openai` client against the simulator: each family's parsers give structured tool calls; none leaks markup."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from simulator.families import FAMILIES, expected_parsers
from tests.support.sim import Sim, cleanup, start, wait_ready
from tests.support.sim_data import MODELS, TOOLS

ASK: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
LEAK = re.compile(r"<\|tool_call|<\|tool_calls_section|<｜tool▁call|<tool_call>|<arg_key>|<｜DSML｜")


@contextlib.contextmanager
def _fleet(tmp_path: Path, launches: dict[str, tuple[str, ...]]) -> Iterator[dict[str, Sim]]:
    """Start several simulators at once (tp 1), wait for all, tear all down."""
    sims: dict[str, Sim] = {}
    try:
        for key, args in launches.items():
            sims[key] = start(tmp_path / key, *args, name=key)
        for sim in sims.values():
            wait_ready(sim)
        yield sims
    finally:
        for sim in sims.values():
            cleanup(sim)


def _client(sim: Sim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url + "/v1", api_key="unused", timeout=30, max_retries=0)


def _streamed(client: openai.OpenAI, model: str) -> tuple[str, dict[int, dict[str, str]], str | None]:
    content, finish = "", None
    calls: dict[int, dict[str, str]] = {}
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            if call.function and call.function.name:
                entry["name"] += call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_each_family_with_its_parsers_gives_structured_tool_calls(tmp_path: Path) -> None:
    """Non-stream and stream: tool_calls named get_weather with JSON arguments, no markup in content."""
    launches = {}
    for family in FAMILIES:
        tool, reasoning = expected_parsers(MODELS[family], family)
        args = ["--model-path", MODELS[family], "--tool-call-parser", str(tool)]
        launches[family] = (*args, *(["--reasoning-parser", reasoning] if reasoning else []))
    with _fleet(tmp_path, launches) as sims:
        for family, sim in sims.items():
            client = _client(sim)
            reply = client.chat.completions.create(model=MODELS[family], messages=ASK, tools=TOOLS)
            message = reply.choices[0].message
            assert reply.choices[0].finish_reason == "tool_calls", family
            assert message.tool_calls and message.tool_calls[0].type == "function"
            function = message.tool_calls[0].function
            assert function.name == "get_weather"
            assert json.loads(function.arguments)["city"] == "Oslo"
            assert not LEAK.search(message.content or ""), family
            content, calls, finish = _streamed(client, MODELS[family])
            assert finish == "tool_calls" and not LEAK.search(content), family
            assert calls[0]["name"] == "get_weather"
            assert json.loads(calls[0]["arguments"])["city"] == "Oslo"


def test_missing_or_wrong_parser_leaks_the_family_markup(tmp_path: Path) -> None:
    """Without a tool-call parser (or with another family's) the raw markup lands in content, no tool_calls."""
    launches: dict[str, tuple[str, ...]] = {f: ("--model-path", MODELS[f]) for f in FAMILIES}
    launches["kimi_with_qwen_parser"] = ("--model-path", MODELS["kimi_k2"], "--tool-call-parser", "qwen25")
    with _fleet(tmp_path, launches) as sims:
        for key, sim in sims.items():
            model = sim.get("/v1/models").json()["data"][0]["id"]
            client = _client(sim)
            reply = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS)
            message = reply.choices[0].message
            assert not message.tool_calls, key
            assert LEAK.search(message.content or ""), key
            content, calls, _ = _streamed(client, model)
            assert not calls and LEAK.search(content), key
