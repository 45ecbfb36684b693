"""The one reader of SGLang's argv: argparse's rules, checked by examples and against argparse itself."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import pytest

from policies import argv
from policies.argv import EXACT, SGLANG, present, redact, scan, value, values
from tests.support.paths import DATA

FLAGS_0523 = DATA / "sglang-0.5.23-flags.txt"


def test_table_holds_every_option_string_of_sglang_0523() -> None:
    """The arity table knows exactly the 561 option strings of the real parser's list."""
    assert set(SGLANG.options) == set(FLAGS_0523.read_text().split())


@pytest.mark.parametrize(
    ("args", "flag", "want"),
    [
        (["--port", "1", "--port", "2"], "--port", "2"),
        (["--port=1", "--port", "2", "--port=3"], "--port", "3"),
        (["--tp", "8"], "--tp-size", "8"),
        (["--tensor-parallel-size", "4", "--tp-size", "2"], "--tp-size", "2"),
        (["--tp-size", "2", "--tensor-parallel-size=4"], "--tp-size", "4"),
        (["--model", "m"], "--model-path", "m"),
        (["--model-path", "a", "--model", "b"], "--model", "b"),
        (["--dp=2"], "--dp-size", "2"),
        (["--mem-frac", "0.8"], "--mem-fraction-static", "0.8"),
        (["--mem-fraction-static", "-0.05"], "--mem-fraction-static", "-0.05"),
        (["--served-model-name", "a b"], "--served-model-name", "a b"),
        (["--port"], "--port", None),
        (["--port", "--enable-metrics"], "--port", None),
        (["--enable-metrics"], "--port", None),
        (["--cuda-graph-max-bs", "8"], "--cuda-graph-max-bs", "8"),
        (["--port", "1", "--", "--port", "2"], "--port", "1"),
    ],
)
def test_value_reads_like_argparse(args: list[str], flag: str, want: str | None) -> None:
    """Last occurrence wins, `=` and space forms, aliases and unique prefixes resolve to one option."""
    assert value(args, flag) == want


def test_switches_take_no_value_and_pairs_keep_the_last_polarity() -> None:
    """A store_true flag is present or not; in a --x/--no-x pair the last spelling decides."""
    args = ["--enable-metrics", "--enable-tf32-matmul", "--no-enable-tf32-matmul", "--model-path", "m"]
    assert present(args, "--enable-metrics")
    assert present(["--disable-overlap"], "--disable-overlap-schedule")
    assert not present(["--enable-metrics"], "--enable-metrics-for-all-schedulers")
    assert not present(args, "--enable-tf32-matmul")
    assert present(args, "--no-enable-tf32-matmul")
    assert present(args, "--enable-hicache") is False
    assert present(["--enable-hierarchical-cache"], "--enable-hicache")
    assert value(args, "--model-path") == "m"


def test_lists_keep_the_last_occurrence() -> None:
    """nargs='+' keeps every value of the last occurrence; an abbreviation reads its flag's value."""
    args = ["--cuda-graph-bs-decode", "1", "2", "--cuda-graph-bs-decode", "4", "8", "--tp", "2"]
    assert values(args, "--cuda-graph-bs-decode") == ("4", "8")
    assert value(args, "--tp-size") == "2"
    assert value(args, "--dp-size") is None


def test_ambiguous_prefix_is_an_unknown_option_not_a_guess() -> None:
    """`--cuda-graph-max-bs` matches two options: it is not read as either of them."""
    args = ["--cuda-graph-max-bs", "8"]
    assert value(args, "--cuda-graph-max-bs-decode") is None
    assert [o.known for o in scan(args)] == [False]


def test_exact_table_reads_spellings_as_written() -> None:
    """With no table (a router's argv), options are matched by exact spelling and take what follows."""
    args = ["--prefill", "http://p:1", "8998", "--port", "8000", "--tp", "2"]
    assert values(args, "--prefill", EXACT) == ("http://p:1", "8998")
    assert value(args, "--port", EXACT) == "8000"
    assert value(args, "--tp-size", EXACT) is None


def test_leading_command_is_not_an_option_value() -> None:
    """The interpreter and module before the first option do not change what the options hold."""
    args = ["/venv/bin/python", "-m", "sglang.launch_server", "--port", "31000"]
    assert value(args, "--port") == "31000"


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--api-key", "s3", "--port", "1"], ["--api-key", "***", "--port", "1"]),
        (["--api-key=s3"], ["--api-key=***"]),
        (["--admin-api-key", "s3"], ["--admin-api-key", "***"]),
        (["--api-k", "s3"], ["--api-k", "***"]),
        (
            ["--ssl-keyfile-password=pw", "--ssl-keyfile", "/k"],
            ["--ssl-keyfile-password=***", "--ssl-keyfile", "/k"],
        ),
        (["--hf-token", "t", "--max-total-tokens", "9"], ["--hf-token", "***", "--max-total-tokens", "9"]),
        (["--model-path", "m"], ["--model-path", "m"]),
    ],
)
def test_redact_hides_secret_values_only(args: list[str], want: list[str]) -> None:
    """Secret flags (any spelling, unknown ones by name) lose their values; other flags keep theirs."""
    assert redact(args) == want


# ---- differential: argparse itself, built from the same table, is the oracle


_DESTS: dict[str, str] = {}


class _Rejected(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _Rejected(message)


def _stdlib_parser() -> _Parser:
    parser = _Parser(add_help=False)
    groups: dict[str, list[str]] = {}
    for option, spec in SGLANG.options.items():
        groups.setdefault(spec.key, []).append(option)
    for key, options in groups.items():
        spec = SGLANG.options[key]
        dest = _DESTS.setdefault(f"d{len(_DESTS)}", key) and f"d{len(_DESTS) - 1}"
        if spec.arity == "0" and any(SGLANG.options[o].negated for o in options):
            positive = [o for o in options if not SGLANG.options[o].negated]
            parser.add_argument(*positive, dest=dest, action=argparse.BooleanOptionalAction)
        elif spec.arity == "0":
            parser.add_argument(*options, dest=dest, action="store_true", default=None)
        else:
            nargs = None if spec.arity == "1" else spec.arity
            parser.add_argument(*options, dest=dest, nargs=nargs)
    return parser


def _random_argv(rng: random.Random, options: Sequence[str]) -> list[str]:
    samples = ["8", "-0.05", "0.5", "a b", "x", "-1e5", "-x", "--no-such-flag", "--port=7", "--"]
    out: list[str] = []
    for _ in range(rng.randint(1, 7)):
        option = rng.choice(options)
        if option.startswith("--") and rng.random() < 0.3:
            option = option[: rng.randint(4, len(option))]
        arity = SGLANG.options[SGLANG.resolve(option) or option].arity if SGLANG.resolve(option) else "1"
        if arity != "0" and rng.random() < 0.3:
            out.append(f"{option}={rng.choice(samples[:-3])}")
            continue
        out.append(option)
        count = {"0": 0, "1": 1, "?": rng.randint(0, 1)}.get(arity, rng.randint(0, 3))
        out += [rng.choice(samples) for _ in range(count)]
    return out


def _compare(args: list[str], namespace: argparse.Namespace) -> None:
    given = {_DESTS[dest]: got for dest, got in vars(namespace).items()}
    assert set(given) == {o.key for o in scan(args) if o.known}, args
    for flag, got in given.items():
        arity = SGLANG.options[flag].arity
        if arity == "0":
            assert present(args, flag) == got, args
        elif arity in ("*", "+"):
            assert values(args, flag) == tuple(got), args
        else:
            assert value(args, flag) == got, args


def test_reader_agrees_with_argparse_on_random_argvs() -> None:
    """On 1000 seeded argvs (those argparse accepts), every option's value matches what argparse stored."""
    parser = _stdlib_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    options = sorted(SGLANG.options)
    rng = random.Random(20261201)
    accepted = 0
    for _ in range(1000):
        args = _random_argv(rng, options)
        try:
            namespace = parser.parse_args(args)
        except _Rejected:
            continue
        accepted += 1
        _compare(args, namespace)
    assert accepted > 200


def test_key_names_the_action() -> None:
    """Aliases and prefixes name one action; an unknown flag names itself."""
    assert argv.key("--tensor-parallel-size") == "--tp-size"
    assert argv.key("--tp") == "--tp-size"
    assert argv.key("--no-enable-tf32-matmul") == "--enable-tf32-matmul"
    assert argv.key("--pp") == "--pp"
