"""Leak signatures of parsers.md §4 for every family, and the canary verdicts of parsers.md §5."""

from __future__ import annotations

import json

import pytest

from policies.leaks import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    THINK_MARKERS,
    TOOL_MARKERS,
    ChatResult,
    ToolCall,
    Verdict,
    find_leaks,
    implied_parsers,
    judge_pair,
    judge_reasoning,
    judge_tool,
)
from tests.support.paths import DATA

MARKERS_JSON = DATA / "sglang-0.5.23-markers.json"

# The raw text of one get_weather(city="Paris") call per parser (parsers.md §1).
RAW_CALLS = {
    "deepseekv3": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseekv31": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseekv32": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>',
    "deepseekv4": '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    "deepseekv41": '<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>',
    "qwen": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "hermes": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    "iquest_q1": "<iquest_tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></iquest_tool_call>",
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>',
    "k2_horizon": "<ifm|tool_calls><ifm|tool_call>get_weather<ifm|arg_key>city</ifm|arg_key></ifm|tool_call></ifm|tool_calls>",
    "gpt-oss": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>',
    "muse": '<atem:function_calls><atem:invoke name="get_weather"></atem:invoke></atem:function_calls>',
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "llama3-bare": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "pythonic": '[get_weather(city="Paris")]',
    "lfm2": '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    "interns1": '<|action_start|> <|plugin|>\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|action_end|>',
    "hunyuan": "<tool_calls>\n<tool_call>get_weather<tool_sep>\n</tool_call>\n</tool_calls>",
    "minimax-m2": '<minimax:tool_call>\n<invoke name="get_weather">\n</invoke>\n</minimax:tool_call>',
    "minimax-m3": ']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_weather">',
    "step3": '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather"></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>',
    "gigachat3": 'function call<|role_sep|>\n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "gigachat35": '<｜GCML｜tool_calls><｜GCML｜invoke name="get_weather"></｜GCML｜invoke></｜GCML｜tool_calls>',
    "apertus2509": '<|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>',
    "cohere_command4": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}]<|END_ACTION|>',
    "dots": '<dots_function_call>\n<invoke name="get_weather">\n</invoke>\n</dots_function_call>',
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param></function>',
    "inkling": '<|message_model|>get_weather<|content_invoke_tool_json|>{"name":"get_weather","args":{"city":"Paris"}}<|end_message|>',
}
CLEAN = ("", "The weather in Paris is sunny, 21 degrees.", "42", "I cannot check that without a tool.")


def _call(city: str = "Paris", name: str = "get_weather", call_id: str = "call_1") -> ToolCall:
    return ToolCall(call_id, name, json.dumps({"city": city}))


@pytest.mark.parametrize("marker", [m for m, _ in TOOL_MARKERS + THINK_MARKERS])
def test_every_catalogued_marker_is_found_in_content(marker: str) -> None:
    """Each hard signature of parsers.md §4 is detected inside ordinary text."""
    found = find_leaks(f"Let me check. {marker} done")
    assert any(marker in f or f in marker for f in found), found


@pytest.mark.parametrize(("parser", "raw"), sorted(RAW_CALLS.items()))
def test_raw_call_of_every_family_leaks(parser: str, raw: str) -> None:
    """The native markup of one call, for every parser family, is a leak when it reaches content."""
    assert find_leaks(raw, think=False), parser


@pytest.mark.skipif(not MARKERS_JSON.exists(), reason="the shared reference data is not on this machine")
def test_markers_of_sglang_0_5_23_are_all_detected() -> None:
    """Every begin/start/trigger token and think token SGLang 0.5.23 knows is a leak signature."""
    data = json.loads(MARKERS_JSON.read_text())
    missed = []
    for name, info in data["tool_call_parsers"].items():
        for key in ("bot_token", "tool_call_start_token", "trigger", "structure_begin"):
            token = info.get(key)
            if token and not find_leaks(token):
                missed.append((name, key, token))
    for name, info in data["reasoning_parsers"].items():
        for key in ("think_start_token", "think_end_token"):
            token = info.get(key)
            if token and not find_leaks(token):
                missed.append((name, key, token))
    assert not missed


@pytest.mark.parametrize("text", CLEAN)
def test_clean_answers_have_no_leak(text: str) -> None:
    """Prose, numbers and empty content are clean."""
    assert find_leaks(text) == []


def test_reasoning_markers_can_be_excluded() -> None:
    """think=False ignores reasoning tags but still sees tool markup."""
    assert find_leaks("<think>hmm</think>", think=False) == []
    assert find_leaks("<think>hmm</think><tool_call>", think=False) == ["<tool_call>"]


def test_implied_parsers_name_the_family() -> None:
    """A Kimi marker points at kimi_k2, a shape match says shape."""
    assert implied_parsers(["<|tool_calls_section_begin|>", "functions.get_weather:0"]) == [
        "kimi_k2",
        "shape",
    ]


def test_clean_tool_call_passes() -> None:
    """One get_weather call with the asked city and finish_reason tool_calls passes."""
    v = judge_tool(ChatResult(200, "", "", (_call(),), "tool_calls", 20), "get_weather", "Paris")
    assert v.verdict == PASS
    assert v.cities == ("Paris",)


@pytest.mark.parametrize(
    ("result", "reason_part"),
    [
        (ChatResult(200, RAW_CALLS["kimi_k2"], finish_reason="stop"), "markup in content"),
        (ChatResult(200, RAW_CALLS["deepseekv31"], finish_reason="tool_calls"), "markup in content"),
        (ChatResult(200, "", finish_reason="tool_calls"), "without tool calls"),
        (ChatResult(200, "", calls=(_call(name="function"),), finish_reason="tool_calls"), "undeclared"),
        (
            ChatResult(
                200,
                "",
                calls=(ToolCall("c", "get_weather", "get_weather\n```json"),),
                finish_reason="tool_calls",
            ),
            "not JSON",
        ),
        (
            ChatResult(200, "", calls=(ToolCall("c", "get_weather", "{}"),), finish_reason="tool_calls"),
            "lack",
        ),
        (ChatResult(200, "", calls=(_call("Oslo"),), finish_reason="tool_calls"), "wrong city"),
        (ChatResult(200, "", "I will call <tool_call>get_weather", finish_reason="stop"), "inside reasoning"),
        (ChatResult(200, "", calls=(_call(),), finish_reason="tool_calls", stream_errors=("x",)), "x"),
    ],
)
def test_definitive_tool_failures(result: ChatResult, reason_part: str) -> None:
    """Leaks and structural signatures 1–3 fail the canary at once."""
    v = judge_tool(result, "get_weather", "Paris")
    assert v.verdict == FAIL
    assert reason_part in v.reason


@pytest.mark.parametrize(
    "result",
    [
        ChatResult(None, error="timeout"),
        ChatResult(503),
        ChatResult(500),
        ChatResult(200, "", finish_reason="length", completion_tokens=256),
        ChatResult(200, "It is sunny in Paris.", finish_reason="stop", completion_tokens=8),
        ChatResult(200, "", finish_reason="stop", completion_tokens=40),
    ],
)
def test_inconclusive_tool_results(result: ChatResult) -> None:
    """No answer, an error status, length, a declined call or a swallowed call are retried, not alarmed."""
    assert judge_tool(result, "get_weather", "Paris").verdict == INCONCLUSIVE


def test_reasoning_mention_of_a_marker_alone_is_not_a_failure() -> None:
    """Markers inside reasoning_content fail only with a complete call structure."""
    v = judge_tool(
        ChatResult(200, "", "the <tool_call> tag", (_call(),), "tool_calls"), "get_weather", "Paris"
    )
    assert v.verdict == PASS


def test_pair_disagreement_fails() -> None:
    """A call in non-stream but none in stream (a swallowing detector) is a definitive failure."""
    good = Verdict(PASS, "ok", cities=("Paris",))
    swallowed = Verdict(INCONCLUSIVE, "tokens generated but nothing delivered (swallowed)")
    assert judge_pair(good, swallowed).verdict == FAIL
    assert judge_pair(good, Verdict(PASS, "ok", cities=("Oslo",))).verdict == FAIL
    assert judge_pair(good, Verdict(PASS, "ok", cities=("paris",))).verdict == PASS


def test_pair_with_an_unanswered_side_is_inconclusive() -> None:
    """A timeout on one side is a health problem, not a disagreement."""
    good = Verdict(PASS, "ok", cities=("Paris",))
    assert judge_pair(good, Verdict(INCONCLUSIVE, "no answer", answered=False)).verdict == INCONCLUSIVE
    assert judge_pair(Verdict(FAIL, "leak"), good).verdict == FAIL


@pytest.mark.parametrize(
    ("result", "verdict"),
    [
        (ChatResult(200, "42", "17 plus 25 is 42", finish_reason="stop"), PASS),
        (ChatResult(200, "<think>17+25</think>42", finish_reason="stop"), FAIL),
        (ChatResult(200, "17+25 is 42</think>42", finish_reason="stop"), FAIL),
        (ChatResult(200, "", "17+25 = 42. Answer: 42", finish_reason="stop"), FAIL),
        (ChatResult(200, "", "thinking...", finish_reason="length"), INCONCLUSIVE),
        (ChatResult(200, "42", "", finish_reason="stop"), INCONCLUSIVE),
        (ChatResult(503), INCONCLUSIVE),
    ],
)
def test_reasoning_canary_verdicts(result: ChatResult, verdict: str) -> None:
    """Tier-2: separated reasoning passes, think markup in content or an answer stuck in reasoning fails."""
    assert judge_reasoning(result, "42").verdict == verdict
