"""Our argv reader against the real SGLang 0.5.23 parser: its option table, and what it stores for argvs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from policies import sglang_flags
from policies.argv import SGLANG, present, scan, value, values
from tests.support.real_sglang import run_real_script

GROUPS = {
    "0": "SWITCHES",
    "1": "ONE_VALUE",
    "?": "OPTIONAL_VALUE",
    "*": "ANY_VALUES",
    "+": "SOME_VALUES",
}
FIXED = [
    ["--model-path", "m", "--tp", "2", "--port=31000", "--port", "31001"],
    ["--model", "m", "--tensor-parallel-size", "4", "--tp-size=2", "--mem-frac", "0.8"],
    ["--model-path", "m", "--enable-tf32-matmul", "--no-enable-tf32-matmul", "--enable-hicache"],
    ["--model-path", "m", "--cuda-graph-bs-decode", "1", "2", "--cuda-graph-bs-decode", "4"],
    ["--model-path", "m", "--dp=2", "--disable-overlap", "--api-key", "k", "--speculative-draft-model", "d"],
    ["--model-path", "m", "--cuda-graph-max-bs", "8"],
]
SKIP_DESTS = ("enable_amd_monokernel", "lora_paths", "help")

SCRIPT = """
import argparse, contextlib, io, json, random
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
actions = []
for a in parser._actions:
    a.default = argparse.SUPPRESS
    arity = "0" if a.nargs == 0 else "1" if a.nargs is None else str(a.nargs)
    if a.choices:
        sample = str(list(a.choices)[0])
    else:
        sample = {int: "8", float: "0.5"}.get(a.type, "x")
    actions.append({"opts": a.option_strings, "dest": a.dest, "arity": arity, "sample": sample})
rng = random.Random(20261201)
usable = [a for a in actions if a["dest"] not in SKIP]
argvs = list(FIXED)
for _ in range(1500):
    argv = ["--model-path", "m"]
    for _ in range(rng.randint(1, 6)):
        a = rng.choice(usable)
        opt = rng.choice(a["opts"])
        if opt.startswith("--") and rng.random() < 0.3:
            opt = opt[: rng.randint(4, len(opt))]
        if a["arity"] != "0" and rng.random() < 0.3:
            argv.append(opt + "=" + a["sample"])
            continue
        argv.append(opt)
        count = {"0": 0, "1": 1, "?": rng.randint(0, 1)}.get(a["arity"], rng.randint(0, 3))
        argv += [a["sample"]] * count
    argvs.append(argv)
results = []
for argv in argvs:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            results.append(vars(parser.parse_args(argv)))
    except SystemExit:
        results.append(None)
print(json.dumps({"actions": actions, "argvs": argvs, "results": results}, default=str))
"""


@pytest.fixture(scope="module")
def real(real_python: Path) -> dict[str, Any]:
    """The real parser's actions and what it stored for FIXED and 1500 seeded random argvs."""
    script = f"FIXED = {FIXED!r}\nSKIP = {list(SKIP_DESTS)!r}\n"
    result: dict[str, Any] = json.loads(run_real_script(real_python, script + SCRIPT))
    return result


def test_flag_table_matches_the_real_parser(real: dict[str, Any]) -> None:
    """policies/sglang_flags.py lists every real action with its aliases and its number of values."""
    fresh: dict[str, list[str]] = {name: [] for name in GROUPS.values()}
    for action in real["actions"]:
        fresh[GROUPS[action["arity"]]].append("|".join(action["opts"]))
    ours = {name: getattr(sglang_flags, name).split() for name in GROUPS.values()}
    assert {k: sorted(v) for k, v in ours.items()} == {k: sorted(v) for k, v in fresh.items()}, json.dumps(
        fresh, indent=1
    )


def _same(ours: str | None, theirs: object) -> bool:
    if isinstance(theirs, bool) or theirs is None:
        return ours == theirs or (theirs is None and ours is None)
    if isinstance(theirs, int | float):
        return ours is not None and type(theirs)(ours) == theirs
    return ours == str(theirs)


def _check(args: list[str], stored: dict[str, Any], dests: dict[str, str]) -> list[str]:
    problems: list[str] = []
    known = {o.key for o in scan(args) if o.known}
    given = {dests[d] for d in stored if d in dests}
    if known != given:
        problems.append(f"{args}: options read {sorted(known)}, parser stored {sorted(given)}")
    for dest, got in stored.items():
        flag = dests.get(dest)
        if flag is None or dest in SKIP_DESTS:
            continue
        arity = SGLANG.options[flag].arity
        if arity == "0":
            ok = present(args, flag) == got
        elif arity in ("*", "+"):
            ours = values(args, flag) or ()
            ok = len(ours) == len(got) and all(_same(o, t) for o, t in zip(ours, got, strict=True))
        elif arity == "?" and values(args, flag) == ():
            ok = True  # given without a value: the parser stores the action's const
        else:
            ok = _same(value(args, flag), got)
        if not ok:
            problems.append(f"{args}: {flag} stored {got!r}, read {values(args, flag)!r}")
    return problems


def test_reader_agrees_with_the_real_parser(real: dict[str, Any]) -> None:
    """For every argv the real parser accepts, each option we read holds what the parser stored."""
    dests = {a["dest"]: a["opts"][0] for a in real["actions"]}
    accepted = [(a, r) for a, r in zip(real["argvs"], real["results"], strict=True) if r is not None]
    problems = [p for args, stored in accepted for p in _check(args, stored, dests)]
    assert problems == []
    assert len(accepted) > 300
    assert real["results"][len(FIXED) - 1] is None  # the ambiguous --cuda-graph-max-bs
