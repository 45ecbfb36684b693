"""Flag compatibility with the installed SGLang: parsing its --help, renames, expressing argvs and ladders."""

from __future__ import annotations

from policies.flagcompat import RENAMES, FlagSet, check_ladders, express_argv, parse_help, rejected
from policies.ladders import DEFAULT_LADDERS, parse_ladders
from tests.support.paths import DATA

FLAGS_0523 = DATA / "sglang-0.5.23-flags.txt"

HELP = """\
usage: sglang serve [-h] --model-path MODEL_PATH
                    [--tokenizer-mode {auto,slow}] [--tp-size TP_SIZE]
                    [--enable-tf32-matmul | --no-enable-tf32-matmul]
                    [--cuda-graph-backend-decode {full,breakable,disabled}]
                    [--cuda-graph-max-bs-decode CUDA_GRAPH_MAX_BS_DECODE]
                    [--cuda-graph-max-bs-prefill CUDA_GRAPH_MAX_BS_PREFILL]
                    [--cuda-graph-bs-decode CUDA_GRAPH_BS_DECODE [CUDA_GRAPH_BS_DECODE ...]]
                    [--disable-cuda-graph]

options:
  -h, --help            show this help message and exit
  --model-path MODEL_PATH, --model MODEL_PATH
                        The path of the model weights. This can be a local
                        folder or a Hugging Face repo ID.
  --tokenizer-mode {auto,slow}
                        Tokenizer mode. 'auto' will use the fast tokenizer if
                        available, see --old-tokenizer-flag for the rest.
  --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE
                        The tensor parallelism size.
  --enable-tf32-matmul, --no-enable-tf32-matmul
                        Enable TF32.
  --cuda-graph-backend-decode {full,breakable,disabled}
                        Decode backend.
  --cuda-graph-max-bs-decode CUDA_GRAPH_MAX_BS_DECODE
                        Set --cuda-graph-max-bs-prefill too
                        --for-wrapped-lines-that-look-like-flags.
  --cuda-graph-max-bs-prefill CUDA_GRAPH_MAX_BS_PREFILL
  --cuda-graph-bs-decode CUDA_GRAPH_BS_DECODE [CUDA_GRAPH_BS_DECODE ...]
                        Batch sizes.
  --disable-cuda-graph  Deprecated. Use --cuda-graph-
                        backend-{decode,prefill}=disabled instead.
"""

OLD = FlagSet(frozenset({"--model-path", "--tp-size", "--disable-cuda-graph", "--cuda-graph-max-bs"}))


def sglang_0523() -> FlagSet:
    return FlagSet(frozenset(FLAGS_0523.read_text().split()))


def test_parse_help_reads_aliases_choices_and_wrapped_lines() -> None:
    """parse_help finds every option string, aliases included, and none from help prose or choices."""
    flags = parse_help(HELP)
    assert flags.options == {
        "-h",
        "--help",
        "--model-path",
        "--model",
        "--tokenizer-mode",
        "--tp-size",
        "--tensor-parallel-size",
        "--enable-tf32-matmul",
        "--no-enable-tf32-matmul",
        "--cuda-graph-backend-decode",
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
        "--cuda-graph-bs-decode",
        "--disable-cuda-graph",
    }


def test_parse_help_survives_narrow_rewrapping() -> None:
    """Re-wrapping the usage block one token per line changes nothing."""
    usage, _, rest = HELP.partition("\n\n")
    narrow = "\n".join(["usage: sglang serve", *(f"    {w}" for w in usage.split()[3:])])
    assert parse_help(f"{narrow}\n\n{rest}") == parse_help(HELP)


def test_accepts_exact_and_unique_prefix_but_not_ambiguous() -> None:
    """accepts follows argparse: exact strings and unique prefixes pass, ambiguous prefixes fail."""
    flags = parse_help(HELP)
    assert flags.accepts("--tp-size")
    assert flags.accepts("--tp")
    assert not flags.accepts("--cuda-graph-max-bs")
    assert not flags.accepts("--no-such-flag")
    assert not flags.accepts("-x")


def test_renames_go_both_ways() -> None:
    """Every renamed spelling maps back to the one it came from."""
    assert RENAMES["--disable-cuda-graph"] == (
        ("--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled"),
    )
    assert RENAMES["--cuda-graph-max-bs"] == (("--cuda-graph-max-bs-decode",),)
    for old, alternatives in RENAMES.items():
        for alternative in alternatives:
            for new in alternative:
                assert any(old in alt for alt in RENAMES[new]), (old, new)


def test_cuda_graph_max_bs_is_rejected_by_0523_and_mapped() -> None:
    """`--cuda-graph-max-bs 8` is rejected by SGLang 0.5.23 and becomes `--cuda-graph-max-bs-decode 8`."""
    flags = sglang_0523()
    argv = ["--model-path", "m", "--cuda-graph-max-bs", "8", "--tp-size", "2"]
    assert rejected(argv, flags) == ["--cuda-graph-max-bs"]
    expressed = express_argv(argv, flags)
    assert expressed.argv == ("--model-path", "m", "--cuda-graph-max-bs-decode", "8", "--tp-size", "2")
    assert expressed.notes == ("mapped --cuda-graph-max-bs 8 → --cuda-graph-max-bs-decode 8",)
    assert rejected(expressed.argv, flags) == []


def test_express_keeps_values_and_order_for_an_older_target() -> None:
    """New spellings become old ones for an older target; unrelated flags keep their values and order."""
    argv = [
        "--model-path=m",
        "--cuda-graph-max-bs-decode",
        "16",
        "--tp-size",
        "8",
        "--cuda-graph-backend-decode",
        "disabled",
    ]
    expressed = express_argv(argv, OLD)
    assert expressed.argv == (
        "--model-path",
        "m",
        "--cuda-graph-max-bs",
        "16",
        "--tp-size",
        "8",
        "--disable-cuda-graph",
    )


def test_express_disables_both_phases_once_on_an_older_target() -> None:
    """Both backend flags set to disabled become a single `--disable-cuda-graph` for an older target."""
    argv = ["--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill", "disabled"]
    expressed = express_argv(argv, OLD)
    assert expressed.argv == ("--disable-cuda-graph",)
    assert len(expressed.notes) == 2


def test_express_maps_disable_cuda_graph_forward() -> None:
    """`--disable-cuda-graph` becomes both backend flags for a target that lacks it."""
    flags = FlagSet(frozenset({"--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--tp-size"}))
    expressed = express_argv(["--disable-cuda-graph", "--tp-size", "2"], flags)
    assert expressed.argv == (
        "--cuda-graph-backend-decode",
        "disabled",
        "--cuda-graph-backend-prefill",
        "disabled",
        "--tp-size",
        "2",
    )


def test_express_fails_with_a_reason_for_an_unknown_flag() -> None:
    """A flag with no accepted spelling makes the argv inexpressible, and the note says which."""
    expressed = express_argv(["--tp-size", "2", "--warp-drive", "on"], OLD)
    assert expressed.argv is None
    assert "--warp-drive" in expressed.notes[-1]


def test_a_value_specific_rename_needs_that_value() -> None:
    """`--cuda-graph-backend-decode full` has no old spelling: only `disabled` maps."""
    assert express_argv(["--cuda-graph-backend-decode", "full"], OLD).argv is None


def test_default_ladders_fit_0523() -> None:
    """Every default-ladder op is accepted by SGLang 0.5.23."""
    assert check_ladders(DEFAULT_LADDERS, sglang_0523()) == []


def test_check_ladders_reports_an_unknown_flag_by_path() -> None:
    """A rung using a flag the target lacks is reported with its ladder path."""
    ladders, issues = parse_ladders(
        {"oom": [["add --disable-overlap-schedule"], ["remove --gone-*", "set --warp-drive on"]]}
    )
    assert issues == []
    flags = FlagSet(frozenset({"--disable-overlap-schedule"}))
    assert check_ladders(ladders, flags) == ["ladders.oom[1]: --warp-drive not accepted"]
