"""Fallback ladders: op parsing, validation with paths, rung selection, argv rewriting and its diff."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.ladders import (
    DEFAULT_LADDERS,
    ArgvDiff,
    Op,
    PastIncident,
    Rung,
    apply_rungs,
    diff_args,
    ladder_key,
    parse_ladders,
    parse_op,
    select_rung,
)
from policies.states import FaultKind
from tests.support.paths import DATA

FLAGS_FILE = DATA / "sglang-0.5.23-flags.txt"
BASE = (
    "--model-path",
    "m",
    "--tp-size",
    "8",
    "--speculative-algorithm=EAGLE",
    "--speculative-num-steps",
    "3",
)


def rung(*ops: str) -> Rung:
    return Rung(tuple(parse_op(o) for o in ops))


def test_parse_op_roundtrips_its_text() -> None:
    """Each op form parses and prints back as written."""
    for text in (
        "add --disable-overlap-schedule",
        "remove --speculative-*",
        "set --cuda-graph-backend-decode disabled",
        "step --mem-fraction-static -0.05 floor=0.5 start=0.88",
        "step --chunked-prefill-size *0.5 floor=1024 start=8192",
    ):
        assert str(parse_op(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "add",
        "append --x",
        "add -x",
        "add --X",
        "add --x extra",
        "set --x",
        "set --x --y",
        "step --x -0.1 floor=1",
        "step --x 0.1 floor=0 start=1",
        "step --x *2 floor=0 start=1",
        "step --x -1 floor=5 start=1",
        "step --x -a floor=0 start=1",
    ],
)
def test_malformed_ops_are_rejected(text: str) -> None:
    """Unknown verbs, malformed flags, missing values and upward steps raise ValueError."""
    with pytest.raises(ValueError):
        parse_op(text)


def test_validation_reports_paths() -> None:
    """Empty ladders, empty rungs, bad ops, duplicate rungs and unknown kinds are reported with paths."""
    raw: dict[str, object] = {
        "oom": [],
        "collective_hang": [["add --a"], [], ["add --a"], ["nope --b"]],
        "wedge": [["add --a"]],
    }
    ladders, issues = parse_ladders(raw)
    assert [i.path for i in issues] == [
        "oom",
        "collective_hang[1]",
        "collective_hang[2]",
        "collective_hang[3][0]",
        "wedge",
    ]
    assert "oom" not in ladders


def test_repeated_step_rungs_are_not_duplicates() -> None:
    """A step rung may repeat: steps accumulate, so the second application goes further."""
    _, issues = parse_ladders({"oom": [["step --x -1 floor=0 start=4"], ["step --x -1 floor=0 start=4"]]})
    assert issues == []


def test_default_ladders_follow_the_design() -> None:
    """Default ladders: hang → overlap, custom all-reduce, decode cuda graph; spec crash → drop spec."""
    assert [str(r) for r in DEFAULT_LADDERS["collective_hang"]] == [
        "add --disable-overlap-schedule",
        "add --disable-custom-all-reduce",
        "set --cuda-graph-backend-decode disabled",
    ]
    assert [str(r) for r in DEFAULT_LADDERS["crash:spec_decode"]] == ["remove --speculative-*"]
    assert set(DEFAULT_LADDERS) >= {"decode_wedge", "oom", "pd_transfer_wedge"}


@pytest.mark.skipif(not FLAGS_FILE.is_file(), reason="SGLang 0.5.23 flag list (shared reference) not present")
def test_default_ladder_flags_exist_in_sglang() -> None:
    """Every flag a default ladder adds, sets or steps is an option of SGLang 0.5.23."""
    known = set(FLAGS_FILE.read_text().split())
    used = {
        op.flag for ladder in DEFAULT_LADDERS.values() for r in ladder for op in r.ops if op.verb != "remove"
    }
    assert used <= known


def test_ladder_key_prefers_the_tagged_ladder() -> None:
    """crash with spec_decode evidence uses crash:spec_decode; plain crash has no ladder."""
    assert ladder_key(FaultKind.CRASH, ["spec_decode"], DEFAULT_LADDERS) == "crash:spec_decode"
    assert ladder_key(FaultKind.CRASH, [], DEFAULT_LADDERS) is None
    assert ladder_key(FaultKind.OOM, ["other"], DEFAULT_LADDERS) == "oom"


def test_first_fault_relaunches_unchanged_then_each_repeat_moves_down() -> None:
    """Level 0 on the first fault of a kind, then one rung further per repeat, until exhausted."""
    ladder = DEFAULT_LADDERS["collective_hang"]
    assert select_rung("collective_hang", [], ladder).index == 0
    history = [PastIncident("collective_hang", 0)]
    choice = select_rung("collective_hang", history, ladder)
    assert choice.index == 1 and "add --disable-overlap-schedule" in choice.reason
    history += [PastIncident("oom", 1), PastIncident("collective_hang", 1)]
    assert select_rung("collective_hang", history, ladder).index == 2
    exhausted = select_rung("collective_hang", [PastIncident("collective_hang", 3)], ladder)
    assert exhausted.index == 3 and "exhausted" in exhausted.reason


def test_add_and_remove_handle_both_spellings() -> None:
    """remove drops `--flag=value` and `--flag value` forms; add appends once."""
    ladder = (rung("remove --speculative-*"), rung("add --disable-overlap-schedule"))
    argv, diff = apply_rungs(BASE, ladder)
    assert argv == ("--model-path", "m", "--tp-size", "8", "--disable-overlap-schedule")
    assert diff.added == (("--disable-overlap-schedule", ()),)
    assert diff.removed == (("--speculative-algorithm", ("EAGLE",)), ("--speculative-num-steps", ("3",)))
    assert apply_rungs(argv, ladder)[0] == argv


def test_set_replaces_in_place_and_keeps_the_spelling() -> None:
    """set rewrites the first occurrence in its own spelling and drops later duplicates."""
    argv = ("--port=1", "--x", "a", "--port", "2")
    new, diff = apply_rungs(argv, [rung("set --port 3")])
    assert new == ("--port=3", "--x", "a")
    assert diff.changed == (("--port", ("2",), ("3",)),)


def test_oom_ladder_steps_memory_then_chunked_prefill() -> None:
    """OOM: unset --mem-fraction-static starts at 0.88 and drops 0.05 per rung; then chunks halve."""
    ladder = DEFAULT_LADDERS["oom"]
    argv, diff = apply_rungs(BASE, ladder[:3])
    assert argv[-2:] == ("--mem-fraction-static", "0.73")
    assert diff.lines() == ("+--mem-fraction-static 0.73",)
    argv, _ = apply_rungs(BASE, ladder)
    assert argv[-2:] == ("--chunked-prefill-size", "2048")


def test_step_respects_its_floor() -> None:
    """A step never goes below its floor, and does nothing once at or below it."""
    step = rung("step --chunked-prefill-size *0.5 floor=1024 start=8192")
    assert apply_rungs(["--chunked-prefill-size", "1500"], [step])[0] == ("--chunked-prefill-size", "1024")
    assert apply_rungs(["--chunked-prefill-size", "-1"], [step])[0] == ("--chunked-prefill-size", "-1")
    mem = rung("step --mem-fraction-static -0.05 floor=0.5 start=0.88")
    assert apply_rungs(["--mem-fraction-static=0.52"], [mem])[0] == ("--mem-fraction-static=0.5",)


def test_argparse_prefixes_and_aliases_are_the_same_flag() -> None:
    """`--mem-frac 0.7` is `--mem-fraction-static 0.7` to SGLang: the step starts from 0.7 and rewrites it."""
    argv, diff = apply_rungs(
        ["--mem-frac", "0.7"], [rung("step --mem-fraction-static -0.05 floor=0.5 start=0.88")]
    )
    assert argv == ("--mem-fraction-static", "0.65")
    assert diff.lines() == ("~--mem-fraction-static 0.7 → 0.65",)
    added, _ = apply_rungs(["--disable-overlap", "--tp", "2"], [rung("add --disable-overlap-schedule")])
    assert added == ("--disable-overlap", "--tp", "2")
    removed, _ = apply_rungs(
        ["--speculative-draft-model", "d", "--port", "1"], [rung("remove --speculative-*")]
    )
    assert removed == ("--port", "1")
    flipped, _ = apply_rungs(["--no-enable-tf32-matmul"], [rung("add --enable-tf32-matmul")])
    assert flipped == ("--no-enable-tf32-matmul", "--enable-tf32-matmul")


def test_diff_lines_are_readable() -> None:
    """diff lines mark added, removed and changed flags with their values."""
    d = diff_args(["--a", "1", "--b"], ["--a", "2", "--c"])
    assert d.lines() == ("+--c", "---b", "~--a 1 → 2")


_flag = st.sampled_from(["--alpha", "--beta-x", "--gamma", "--delta-y", "--eps"])
_value = st.sampled_from(["1", "0.5", "on", "x-y"])
_argv = st.lists(st.tuples(_flag, st.lists(_value, max_size=2), st.booleans()), max_size=6).map(
    lambda items: tuple(
        t for f, vs, eq in items for t in ([f"{f}={vs[0]}", *vs[1:]] if eq and vs else [f, *vs])
    )
)
_op = st.one_of(
    _flag.map(lambda f: Op("add", f)),
    _flag.map(lambda f: Op("remove", f)),
    st.sampled_from(["--b*", "--d*"]).map(lambda p: Op("remove", p)),
    st.tuples(_flag, _value).map(lambda fv: Op("set", fv[0], value=fv[1])),
)


def _undo(diff: ArgvDiff) -> list[Op]:
    ops = [Op("remove", f) for f, _ in diff.added]
    ops += [Op("set", f, value=v[0]) if v else Op("add", f) for f, v in diff.removed]
    ops += [Op("set", f, value=old[0]) for f, old, _ in diff.changed]
    return ops


@given(argv=_argv, ops=st.lists(_op, max_size=5))
def test_apply_then_diff_roundtrip(argv: tuple[str, ...], ops: list[Op]) -> None:
    """The diff apply_rungs returns equals diff_args of the two argvs, and undoing it restores the flags."""
    new, diff = apply_rungs(argv, [Rung(tuple(ops))])
    assert diff == diff_args(argv, new)
    assert apply_rungs(new, [])[0] == new
    if all(len(v) <= 1 for _, v in diff.removed) and all(len(o) == 1 for _, o, _ in diff.changed):
        back, _ = apply_rungs(new, [Rung(tuple(_undo(diff)))])
        assert diff_args(argv, back).lines() == ()
