"""Parser names SGLang serves alike are one parser to the config check (`qwen25` is `qwen`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from policies.leaks import FAIL, PASS
from policies.model import ProbeSettings
from policies.parsers_table import parsers_match
from probes.canary import config_check


def test_sglang_aliases_of_one_tool_parser_match() -> None:
    """The deprecated names SGLang rewrites, and the keys of the Qwen3-Coder detector, match their parser."""
    assert parsers_match("qwen", "qwen25") and parsers_match("qwen25", "qwen")
    assert parsers_match("glm45", "glm") and parsers_match("glm", "glm45")
    assert parsers_match("qwen3_coder", "step3p5") and parsers_match("qwen3_coder", "nanbeige")
    assert not parsers_match("qwen", "hermes") and not parsers_match("glm45", "glm47")
    assert not parsers_match("qwen", None) and parsers_match(None, None)


def test_reasoning_parsers_have_no_aliases() -> None:
    """Reasoning names sharing a detector class still differ (when reasoning is forced on): exact match only."""
    assert parsers_match("qwen3", "qwen3", reasoning=True)
    assert not parsers_match("qwen3", "qwen3-thinking", reasoning=True)
    assert not parsers_match("step3", "step3p5", reasoning=True)


@pytest.fixture
async def server_info() -> AsyncIterator[Callable[[dict[str, Any]], str]]:
    """A local `/server_info` answering the body the test sets; yields a setter returning the base URL."""
    body: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/server_info", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"

    def answer(info: dict[str, Any]) -> str:
        body.clear()
        body.update(info)
        return base

    try:
        yield answer
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("expected", "reported"),
    [("qwen", "qwen25"), ("glm45", "glm"), ("qwen3_coder", "step3p5")],
)
async def test_config_check_passes_an_alias_of_the_expected_tool_parser(
    server_info: Callable[[dict[str, Any]], str], expected: str, reported: str
) -> None:
    """`--tool-call-parser qwen25` on a Qwen2.5 model is no parser_misconfig: the check passes."""
    base = server_info({"tool_call_parser": reported, "reasoning_parser": None})
    settings = ProbeSettings(expected_tool_parser=expected)
    async with aiohttp.ClientSession() as session:
        obs = await config_check(session, base, settings)
    assert obs.ok and obs.values["verdict"] == PASS


async def test_config_check_still_fails_another_parser_or_a_non_string(
    server_info: Callable[[dict[str, Any]], str],
) -> None:
    """A different detector, or a value that is not a parser name, fails the check."""
    settings = ProbeSettings(expected_tool_parser="qwen")
    async with aiohttp.ClientSession() as session:
        for reported in ("hermes", ["qwen"]):
            base = server_info({"tool_call_parser": reported, "reasoning_parser": None})
            obs = await config_check(session, base, settings)
            assert not obs.ok and obs.values["verdict"] == FAIL, reported
