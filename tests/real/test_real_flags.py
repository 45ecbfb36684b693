"""Our flags against the real SGLang 0.5.23: its --help as we read it, the default ladders, the example configs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from policies.flagcompat import FlagSet, check_ladders, rejected
from policies.ladders import DEFAULT_LADDERS
from policies.plan import build_argv
from supervisor.host.flaghelp import target_flags
from tests.support.real_sglang import run_real_script

ROOT = Path(__file__).resolve().parents[2]
FLAGS_0523 = ROOT / "tests" / "data" / "sglang-0.5.23-flags.txt"
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))

PARSE_SCRIPT = """
import argparse, contextlib, io, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
options = sorted(o for a in parser._actions for o in a.option_strings)
hidden = sorted(o for a in parser._actions if a.help == argparse.SUPPRESS for o in a.option_strings)
results = {}
for name, argv in json.loads(ARGVS).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv)
        results[name] = "ok"
    except SystemExit:
        results[name] = err.getvalue()[-400:]
print(json.dumps({"options": options, "hidden": hidden, "results": results}))
"""


def example_argvs() -> dict[str, list[str]]:
    """Each SGLang server of each example: its args with every rung of one default ladder, and of all at once."""
    argvs: dict[str, list[str]] = {}
    for path in EXAMPLES:
        for server in tomllib.loads(path.read_text())["servers"]:
            if server.get("role", "unified") == "router":
                continue
            args = server.get("args", [])
            name = f"{path.stem}/{server['name']}"
            argvs[name] = list(args)
            for key, ladder in DEFAULT_LADDERS.items():
                argvs[f"{name}+{key}"] = list(build_argv(args, {key: len(ladder)}, DEFAULT_LADDERS)[0])
            every = {key: len(ladder) for key, ladder in DEFAULT_LADDERS.items()}
            argvs[f"{name}+all"] = list(build_argv(args, every, DEFAULT_LADDERS)[0])
    return argvs


OLD_ARGV = ["--model-path", "m", "--cuda-graph-max-bs", "8"]


@pytest.fixture(scope="module")
def real_flags(real_python: Path, tmp_path_factory: pytest.TempPathFactory) -> FlagSet:
    """The real --help as target_flags reads it."""
    flags = target_flags([str(real_python), "-m", "sglang.launch_server"], tmp_path_factory.mktemp("flags"))
    assert isinstance(flags, FlagSet), flags
    return flags


@pytest.fixture(scope="module")
def real_parse(real_python: Path) -> dict[str, Any]:
    """One run of the real argument parser over every example argv and the old `--cuda-graph-max-bs` one."""
    argvs = {**example_argvs(), "old": OLD_ARGV}
    script = f"ARGVS = {json.dumps(argvs)!r}\n{PARSE_SCRIPT}"
    result: dict[str, Any] = json.loads(run_real_script(real_python, script).splitlines()[-1])
    return result


def test_real_help_gives_the_visible_option_strings(real_flags: FlagSet, real_parse: dict[str, Any]) -> None:
    """The real --help parses to every option string of the package's parser except help-suppressed ones."""
    options, hidden = set(real_parse["options"]), set(real_parse["hidden"])
    assert options == set(FLAGS_0523.read_text().split())
    assert real_flags.options == options - hidden


def test_default_ladders_are_accepted(real_flags: FlagSet) -> None:
    """Every flag of every default-ladder rung is accepted by the real SGLang."""
    assert check_ladders(DEFAULT_LADDERS, real_flags) == []


def test_example_argvs_with_every_rung_parse(real_flags: FlagSet, real_parse: dict[str, Any]) -> None:
    """Each example's args, with each default ladder fully applied, pass the real argument parser."""
    argvs = example_argvs()
    assert {name: real_parse["results"][name] for name in argvs} == dict.fromkeys(argvs, "ok")
    assert {name: rejected(argv, real_flags) for name, argv in argvs.items()} == {name: [] for name in argvs}


def test_cuda_graph_max_bs_is_rejected(real_flags: FlagSet, real_parse: dict[str, Any]) -> None:
    """`--cuda-graph-max-bs` is rejected by the real parser (ambiguous) and by our reading of its --help."""
    assert "ambiguous" in real_parse["results"]["old"]
    assert rejected(OLD_ARGV, real_flags) == ["--cuda-graph-max-bs"]


def test_check_config_names_a_transfer_backend_the_interpreter_cannot_import(
    real_python: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PD decode on the real SGLang without Mooncake installed (this venv has none): SGLang would exit at start
    importing it, so check-config exits 78 naming the module and the field of each PD server."""
    from supervisor.cli import main

    def config(backend: str) -> Path:
        text = (ROOT / "examples" / "pd-1p1d.toml").read_text()
        text = text.replace("/opt/sglang/.venv/bin/python", str(real_python))
        text = text.replace("/var/lib/sglang-supervisor", str(tmp_path / "state"))
        text = text.replace("/var/log/sglang-supervisor", str(tmp_path / "log"))
        text = text.replace(
            '"--disaggregation-mode", "decode",',
            f'"--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "{backend}",',
        )
        path = tmp_path / f"{backend}.toml"
        path.write_text(text)
        return path

    assert main(["check-config", "--config", str(config("mooncake"))]) == 78
    err = capsys.readouterr().err
    assert "servers[1].args: --disaggregation-transfer-backend mooncake needs the 'mooncake' module" in err
    assert "servers[0].args: --disaggregation-transfer-backend mooncake" in err  # the default, on the prefill
