"""The simulator's command line against real SGLang 0.5.23's argument parser (one subprocess for all checks)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from simulator.cli import build_parser, parse_server_args
from tests.support.real_sglang import run_real_script

_RESULT = "REAL-CLI-RESULT "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Runs inside the real SGLang venv: build SGLang's own parser once, parse every case, describe the flags.
_SCRIPT = """
import argparse, contextlib, io, json
from sglang.srt.server_args import ServerArgs

request = json.loads(REQUEST)
parser = argparse.ArgumentParser(prog="launch_server")
ServerArgs.add_cli_args(parser)
by_option = {opt: action for action in parser._actions for opt in action.option_strings}
flags = {}
for opt in request["options"]:
    action = by_option.get(opt)
    if action is not None:
        flags[opt] = {
            "dest": action.dest,
            "default": action.default,
            "choices": None if action.choices is None else list(action.choices),
            "required": action.required,
            "switch": action.nargs == 0,
        }
cases = {}
for name, argv in request["cases"].items():
    err = io.StringIO()
    code = 0
    namespace = None
    with contextlib.redirect_stderr(err):
        try:
            namespace = parser.parse_args(argv)
        except SystemExit as exc:
            code = exc.code
    values = {} if namespace is None else {d: getattr(namespace, d, "<absent>") for d in request["dests"]}
    cases[name] = {"code": code, "err": err.getvalue(), "values": values}
print(RESULT + json.dumps({"flags": flags, "cases": cases}, default=repr))
"""

_KIMI_TP8 = [
    "--model-path", "moonshotai/Kimi-K2.5", "--tp", "8", "--trust-remote-code",
    "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2", "--served-model-name", "kimi-k2.5",
    "--host", "127.0.0.1", "--port", "30000", "--enable-metrics", "--context-length", "256k",
    "--mem-fraction-static", "0.9", "--max-running-requests", "128", "--watchdog-timeout", "600",
]  # fmt: skip
_PD_PREFILL = [
    "--model-path", "deepseek-ai/DeepSeek-V3.1", "--disaggregation-mode", "prefill",
    "--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_0",
    "--disaggregation-bootstrap-port", "8998", "--tp-size", "4", "--base-gpu-id", "0", "--port", "30001",
    "--dist-init-addr", "127.0.0.1:5757", "--tool-call-parser", "deepseekv31", "--reasoning-parser",
    "deepseek-v3", "--chunked-prefill-size", "8192", "--max-prefill-tokens", "32k",
]  # fmt: skip
_PD_DECODE = [
    "--model-path", "deepseek-ai/DeepSeek-V3.1", "--disaggregation-mode", "decode",
    "--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_1", "--tp", "4",
    "--base-gpu-id", "4", "--port", "30002", "--dist-init-addr", "127.0.0.1:5758", "--tool-call-parser",
    "deepseekv31", "--reasoning-parser", "deepseek-v3", "--cuda-graph-max-bs-decode", "256",
    "--disable-radix-cache",
]  # fmt: skip
_DP2_TP4 = [
    "--model-path", "Qwen/Qwen3-235B-A22B", "--dp-size", "2", "--tp-size", "4", "--ep", "8",
    "--enable-dp-attention", "--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3",
    "--enable-metrics", "--decode-log-interval", "10",
]  # fmt: skip
_FALLBACK_RUNG = [
    "--model-path", "m", "--disable-cuda-graph", "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled", "--disable-overlap-schedule", "--disable-custom-all-reduce",
    "--watchdog-timeout", "900", "--soft-watchdog-timeout", "120", "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "d", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4", "--attention-backend", "triton", "--kv-cache-dtype", "fp8_e4m3",
    "--page-size", "64", "--schedule-conservativeness", "1.3",
]  # fmt: skip
REALISTIC = {"kimi_k2_5_tp8": _KIMI_TP8, "pd_prefill": _PD_PREFILL, "pd_decode": _PD_DECODE}
REALISTIC |= {"dp2_tp4": _DP2_TP4, "fallback_rung": _FALLBACK_RUNG}
REJECTED = {
    "ambiguous_cuda_graph_max_bs": ["--model-path", "m", "--cuda-graph-max-bs", "8"],
    "unknown_flag": ["--model-path", "m", "--no-such-flag", "1"],
    "bad_tool_call_parser": ["--model-path", "m", "--tool-call-parser", "kimi-k2"],
    "bad_reasoning_parser": ["--model-path", "m", "--reasoning-parser", "deepseek_r1"],
    "removed_cuda_graph_backend": ["--model-path", "m", "--cuda-graph-backend-prefill", "tc_piecewise"],
    "missing_model_path": ["--tp", "8"],
}


def _sim_actions() -> list[argparse.Action]:
    return [a for a in build_parser()._actions if not isinstance(a, argparse._HelpAction)]


def _sample(action: argparse.Action) -> list[str]:
    """A value of the right type for one option (none for a switch)."""
    if action.nargs == 0:
        return []
    if action.choices is not None:
        return [str(list(action.choices)[-1])]
    if action.type is int:
        return ["3"]
    if action.type is float:
        return ["0.75"]
    return ["x"] if action.type is str else ["8k"]


def _option_cases() -> dict[str, list[str]]:
    cases = {}
    for action in _sim_actions():
        for opt in action.option_strings:
            base = [] if action.dest == "model_path" else ["--model-path", "org/model"]
            cases[f"option {opt}"] = [*base, opt, *_sample(action)]
    return cases


def _sim_parse(argv: list[str]) -> dict[str, Any]:
    """Parse with the simulator the way the real script parses: exit code, stderr, field values."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parsed = parse_server_args(argv)
        except SystemExit as exc:
            return {"code": exc.code, "err": err.getvalue(), "values": {}}
    values = {k: v for k, v in dataclasses.asdict(parsed).items() if k != "argv"}
    return {"code": 0, "err": err.getvalue(), "values": values}


def _error_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.startswith("launch_server: error:")][-1]


@pytest.fixture(scope="module")
def cases() -> dict[str, list[str]]:
    """Every argv the module checks, by name."""
    everything = _option_cases()
    everything |= REALISTIC
    everything |= REJECTED
    everything["tp_prefix"] = ["--model-path", "m", "--tp", "8"]
    return everything


@pytest.fixture(scope="module")
def real_results(real_python: Path, cases: dict[str, list[str]]) -> dict[str, Any]:
    """The real parser's verdict on every case and its description of every simulator flag, in one run."""
    request = {
        "options": [opt for action in _sim_actions() for opt in action.option_strings],
        "dests": sorted({action.dest for action in _sim_actions()}),
        "cases": cases,
    }
    script = f"REQUEST = {json.dumps(json.dumps(request))}\nRESULT = {_RESULT!r}\n{_SCRIPT}"
    stdout = run_real_script(real_python, script)
    line = [ln for ln in stdout.splitlines() if ln.startswith(_RESULT)][-1]
    result: dict[str, Any] = json.loads(line[len(_RESULT) :])
    return result


def test_every_sim_option_accepted_by_real_parser(
    real_results: dict[str, Any], cases: dict[str, list[str]]
) -> None:
    """Each option string the simulator accepts is accepted by SGLang with a sample value, to the same value."""
    names = [name for name in cases if name.startswith("option ")]
    assert len(names) >= 60
    for name in names:
        real = real_results["cases"][name]
        assert real["code"] == 0, (name, real["err"][-500:])
        assert real["values"] == _sim_parse(cases[name])["values"], name


def test_sim_flags_declared_like_real(real_results: dict[str, Any]) -> None:
    """Each simulator option has SGLang's field name, default, choices, required-ness and arity."""
    for action in _sim_actions():
        for opt in action.option_strings:
            real = real_results["flags"].get(opt)
            assert real is not None, f"{opt} unknown to SGLang 0.5.23"
            ours = {
                "dest": action.dest,
                "default": action.default,
                "choices": None if action.choices is None else list(action.choices),
                "required": action.required,
                "switch": action.nargs == 0,
            }
            assert ours == real, opt


def test_tp_prefix_accepted_by_both(real_results: dict[str, Any], cases: dict[str, list[str]]) -> None:
    """`--tp 8` is tp_size=8 for SGLang and the simulator alike."""
    real = real_results["cases"]["tp_prefix"]
    assert real["code"] == 0
    assert real["values"]["tp_size"] == _sim_parse(cases["tp_prefix"])["values"]["tp_size"] == 8


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_by_both_with_the_same_error(real_results: dict[str, Any], name: str) -> None:
    """Ambiguous prefixes, unknown flags, bad parser names, removed backends, missing model: same exit 2 and error."""
    real = real_results["cases"][name]
    sim = _sim_parse(REJECTED[name])
    assert real["code"] == sim["code"] == 2
    assert _error_line(sim["err"]) == _error_line(real["err"])


@pytest.mark.parametrize("name", sorted(REALISTIC))
def test_realistic_argv_parses_to_the_same_values(real_results: dict[str, Any], name: str) -> None:
    """Production-shaped argv lists (Kimi TP8, PD prefill/decode, DP2xTP4, a fallback rung) parse identically."""
    real = real_results["cases"][name]
    sim = _sim_parse(REALISTIC[name])
    assert real["code"] == sim["code"] == 0, real["err"][-500:]
    assert real["values"] == sim["values"]


def test_deprecation_warnings_match_real(real_results: dict[str, Any]) -> None:
    """The simulator's deprecation warnings are SGLang's lines, colour codes aside."""
    sim_err = _sim_parse(_FALLBACK_RUNG)["err"] + _sim_parse(_DP2_TP4)["err"]
    real_err = _ANSI.sub(
        "", real_results["cases"]["fallback_rung"]["err"] + real_results["cases"]["dp2_tp4"]["err"]
    )
    warnings = [line for line in sim_err.splitlines() if "is deprecated" in line]
    assert len(warnings) == 2
    for line in warnings:
        assert line in real_err.splitlines()
