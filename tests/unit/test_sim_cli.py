"""The simulator's SGLang-compatible command line (simulator/cli.py)."""

from __future__ import annotations

import argparse
import json

import pytest

from simulator.cli import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    SimServerArgs,
    build_parser,
    parse_server_args,
)
from tests.support.paths import DATA

_FLAGS_NAME = "sglang-0.5.23-flags.txt"
_MARKERS_NAME = "sglang-0.5.23-markers.json"


_DATA = DATA
_FLAGS_FILE = _DATA / _FLAGS_NAME
_MARKERS_FILE = _DATA / _MARKERS_NAME


def _option_strings() -> list[str]:
    return [opt for action in build_parser()._actions for opt in action.option_strings]


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exited:
        parse_server_args(argv)
    code = exited.value.code
    assert isinstance(code, int)
    return code


def test_every_option_string_exists_in_sglang_0_5_23() -> None:
    """Each option string the simulator accepts is one of real SGLang 0.5.23's option strings."""
    assert _FLAGS_FILE is not None
    real = set(_FLAGS_FILE.read_text().split())
    assert len(real) == 561
    missing = [opt for opt in _option_strings() if opt not in real]
    assert missing == []


def test_parser_choices_are_the_0_5_23_registries() -> None:
    """--tool-call-parser and --reasoning-parser accept exactly SGLang 0.5.23's parser names."""
    assert _MARKERS_FILE is not None
    markers = json.loads(_MARKERS_FILE.read_text())
    assert set(TOOL_CALL_PARSERS) == set(markers["tool_call_parsers"])
    assert set(REASONING_PARSERS) == set(markers["reasoning_parsers"])


def test_unique_prefix_tp_is_tp_size() -> None:
    """`--tp 8` is argparse's unique-prefix abbreviation of --tp-size."""
    assert parse_server_args(["--model-path", "m", "--tp", "8"]).tp_size == 8


@pytest.mark.parametrize(
    ("alias", "field"),
    [
        ("--model", "model_path"),
        ("--tensor-parallel-size", "tp_size"),
        ("--data-parallel-size", "dp_size"),
        ("--pipeline-parallel-size", "pp_size"),
        ("--expert-parallel-size", "ep_size"),
        ("--ep", "ep_size"),
        ("--nccl-init-addr", "dist_init_addr"),
        ("--speculative-draft-model", "speculative_draft_model_path"),
    ],
)
def test_aliases_fill_the_sglang_field(alias: str, field: str) -> None:
    """SGLang's aliases set the same field as the primary flag."""
    base = [] if field == "model_path" else ["--model-path", "m"]
    parsed = parse_server_args([*base, alias, "4"])
    assert str(getattr(parsed, field)) == "4"


def test_ambiguous_prefix_exits_2_naming_candidates(capsys: pytest.CaptureFixture[str]) -> None:
    """`--cuda-graph-max-bs 8` is ambiguous (decode or prefill), exit 2 with argparse's message."""
    assert _exit_code(["--model-path", "m", "--cuda-graph-max-bs", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: launch_server")
    assert (
        "launch_server: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    ) in err


def test_unknown_flag_exits_2_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """A flag the simulator does not know is rejected like argparse: usage, error line, exit 2."""
    assert _exit_code(["--model-path", "m", "--no-such-flag", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: launch_server")
    assert "launch_server: error: unrecognized arguments: --no-such-flag 1" in err


def test_missing_model_path_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """--model-path is required, as in SGLang."""
    assert _exit_code(["--tp", "2"]) == 2
    assert "the following arguments are required: --model-path" in capsys.readouterr().err


def test_disable_cuda_graph_warns_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    """--disable-cuda-graph still works and prints SGLang's deprecation warning on stderr."""
    parsed = parse_server_args(["--model-path", "m", "--disable-cuda-graph"])
    assert parsed.disable_cuda_graph is True
    err = capsys.readouterr().err
    assert "'--disable-cuda-graph' is deprecated and will be removed in a future release." in err
    assert "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead." in err


def test_enable_dp_attention_warns_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    """--enable-dp-attention is deprecated in 0.5.23 in favour of --attn-dp-size, and still stored."""
    parsed = parse_server_args(["--model-path", "m", "--dp-size", "2", "--enable-dp-attention"])
    assert parsed.enable_dp_attention is True
    assert "'--enable-dp-attention' is deprecated" in capsys.readouterr().err


def test_defaults_match_sglang() -> None:
    """Flags left out take SGLang 0.5.23's defaults."""
    parsed = parse_server_args(["--model-path", "org/model"])
    assert (parsed.host, parsed.port) == ("127.0.0.1", 30000)
    assert (parsed.tp_size, parsed.dp_size, parsed.pp_size, parsed.ep_size) == (1, 1, 1, 1)
    assert parsed.watchdog_timeout == 300.0
    assert parsed.soft_watchdog_timeout is None
    assert parsed.stream_interval == 1
    assert parsed.decode_log_interval == 40
    assert parsed.disaggregation_mode == "null"
    assert parsed.disaggregation_bootstrap_port == 8998
    assert parsed.disaggregation_transfer_backend == "mooncake"
    assert parsed.max_prefill_tokens == 16384
    assert parsed.kv_cache_dtype == "auto"
    assert parsed.log_level == "info"
    assert parsed.tool_call_parser is None and parsed.reasoning_parser is None
    assert parsed.disable_cuda_graph is False and parsed.enable_metrics is False
    assert parsed.argv == ("--model-path", "org/model")


def test_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """--help answers with exit 0 and lists the flags."""
    with pytest.raises(SystemExit) as exited:
        parse_server_args(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model-path", "--tp-size", "--tool-call-parser", "--cuda-graph-max-bs-decode"):
        assert flag in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--tool-call-parser", "kimi-k2"],
        ["--reasoning-parser", "deepseek_r1"],
        ["--disaggregation-mode", "both"],
        ["--cuda-graph-backend-decode", "tc_piecewise"],
        ["--tp", "eight"],
    ],
)
def test_invalid_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A value SGLang would refuse (unknown parser, bad choice, removed backend, not an int) exits 2."""
    assert _exit_code(["--model-path", "m", *argv]) == 2
    assert f"error: argument {argv[0]}" in capsys.readouterr().err


def test_auto_parsers_accepted() -> None:
    """`auto` is a valid tool-call and reasoning parser."""
    parsed = parse_server_args(
        ["--model-path", "m", "--tool-call-parser", "auto", "--reasoning-parser", "auto"]
    )
    assert (parsed.tool_call_parser, parsed.reasoning_parser) == ("auto", "auto")


@pytest.mark.parametrize(
    ("text", "value"), [("4096", 4096), ("128k", 128000), ("25.6k", 25600), ("32Ki", 32768)]
)
def test_token_flags_take_si_and_iec_suffixes(text: str, value: int) -> None:
    """--context-length and the token-count flags accept SGLang's human-readable integers."""
    assert parse_server_args(["--model-path", "m", "--context-length", text]).context_length == value


def test_served_name_and_server_info() -> None:
    """served_name falls back to the model path; server_info maps fields to values and masks the API key."""
    plain = parse_server_args(["--model-path", "moonshotai/Kimi-K2.5"])
    assert plain.served_name == "moonshotai/Kimi-K2.5"
    named = parse_server_args(
        ["--model-path", "m", "--served-model-name", "kimi", "--api-key", "s3cret", "--tp", "8"]
    )
    assert named.served_name == "kimi"
    info = named.server_info()
    assert info["tp_size"] == 8 and info["served_model_name"] == "kimi"
    assert "argv" not in info
    assert "s3cret" not in repr(info) and "s3cret" not in repr(named)


def test_parsed_args_are_frozen() -> None:
    """SimServerArgs cannot be changed after parsing."""
    parsed = parse_server_args(["--model-path", "m"])
    with pytest.raises(AttributeError):
        parsed.tp_size = 2  # type: ignore[misc]
    assert isinstance(parsed, SimServerArgs)


def test_build_parser_is_argparse_named_launch_server() -> None:
    """build_parser returns an ArgumentParser whose prog is `launch_server`."""
    parser = build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    assert parser.prog == "launch_server"
