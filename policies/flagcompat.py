"""Which flags the installed SGLang accepts, and how to say a rung in the spelling it knows. Pure.

SGLang renames flags between releases (sglang-internals §5): 0.5.23 rejects `--cuda-graph-max-bs` as an
ambiguous abbreviation and deprecates `--disable-cuda-graph` in favour of the per-phase backend flags, which
older releases lack. A fallback rung cures nothing if the target refuses to start with it, so the argv is
rewritten into spellings the target's own `--help` lists, or reported as inexpressible.

`RENAMES` keys are either a bare flag (any values; a replacement without `=` receives those values) or
`--flag=value` (only that value; the replacement spellings carry their own values). Each key maps to
alternatives tried in order; the first whose every flag the target accepts wins.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies import argv
from policies.ladders import Rung

_OPTION = re.compile(r"(?:^|(?<=[\s\[|(]))(--?[A-Za-z0-9][A-Za-z0-9_.-]*)")
_BRACES = re.compile(r"\{[^{}]*\}")
_INVOCATION = re.compile(r"^ {1,8}(-\S.*?)(?: {2,}\S.*)?$")


@dataclass(frozen=True)
class FlagSet:
    """Every option string the target's argument parser accepts (`--tp-size`, `--tensor-parallel-size`, `-h`)."""

    options: frozenset[str]

    def accepts(self, flag: str) -> bool:
        """True for an option string, or a long-option prefix argparse would expand uniquely."""
        if flag in self.options:
            return True
        if not flag.startswith("--"):
            return False
        return len([o for o in self.options if o.startswith(flag)]) == 1


def parse_help(text: str) -> FlagSet:
    """The option strings in an argparse `--help` text: its usage block and its options sections."""
    options: set[str] = set()
    section = "usage"
    for line in text.splitlines():
        if line and not line[0].isspace():
            section = "usage" if line.startswith("usage:") else "options"
        if section == "usage":
            options.update(_OPTION.findall(_BRACES.sub("", line.removeprefix("usage:"))))
            continue
        match = _INVOCATION.match(line)
        if match is not None:
            for part in _BRACES.sub("", match.group(1)).split(","):
                word = part.split()[0] if part.split() else ""
                if _OPTION.fullmatch(word):
                    options.add(word)
    return FlagSet(frozenset(options))


_DISABLED = "disabled"
RENAMES: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "--disable-cuda-graph": (
        (f"--cuda-graph-backend-decode={_DISABLED}", f"--cuda-graph-backend-prefill={_DISABLED}"),
    ),
    f"--cuda-graph-backend-decode={_DISABLED}": (("--disable-cuda-graph",),),
    f"--cuda-graph-backend-prefill={_DISABLED}": (
        ("--disable-piecewise-cuda-graph",),
        ("--disable-cuda-graph",),
    ),
    "--disable-piecewise-cuda-graph": ((f"--cuda-graph-backend-prefill={_DISABLED}",),),
    "--cuda-graph-max-bs": (("--cuda-graph-max-bs-decode",),),
    "--cuda-graph-max-bs-decode": (("--cuda-graph-max-bs",),),
    "--cuda-graph-bs": (("--cuda-graph-bs-decode",),),
    "--cuda-graph-bs-decode": (("--cuda-graph-bs",),),
    "--piecewise-cuda-graph-max-tokens": (("--cuda-graph-max-bs-prefill",),),
    "--cuda-graph-max-bs-prefill": (("--piecewise-cuda-graph-max-tokens",),),
    "--piecewise-cuda-graph-tokens": (("--cuda-graph-bs-prefill",),),
    "--cuda-graph-bs-prefill": (("--piecewise-cuda-graph-tokens",),),
    "--piecewise-cuda-graph-compiler": (("--cuda-graph-tc-compiler",),),
    "--cuda-graph-tc-compiler": (("--piecewise-cuda-graph-compiler",),),
}


@dataclass(frozen=True)
class Expressed:
    """The argv in spellings the target accepts (None when impossible), and what was changed or why not."""

    argv: tuple[str, ...] | None
    notes: tuple[str, ...]


def _is_flag(token: str) -> bool:
    return len(token) > 1 and token[0] == "-" and (token[1].isalpha() or (token[1] == "-" and len(token) > 2))


def _entries(args: Sequence[str]) -> list[tuple[str | None, tuple[str, ...]]]:
    """(flag as written or None for leading positionals, its values); `--flag=value` gives (`--flag`, (value,)).

    Split as SGLang's parser splits (`policies.argv`); tokens it would reject stay with the flag before them.
    """
    found = argv.scan(args)
    lead = tuple(args[: found[0].start] if found else args)
    entries: list[tuple[str | None, tuple[str, ...]]] = [(None, lead)] if lead else []
    for o in found:
        explicit = (o.tokens[0].partition("=")[2],) if o.explicit else ()
        entries.append((o.written, (*explicit, *o.tokens[1:])))
    return entries


def _spell(spelling: str, values: tuple[str, ...]) -> list[str]:
    flag, eq, value = spelling.partition("=")
    return [flag, value] if eq else [flag, *values]


def _rename(flag: str, values: tuple[str, ...], flags: FlagSet) -> list[str] | None:
    keys = [f"{flag}={values[0]}"] if len(values) == 1 else []
    for key in [*keys, flag]:
        for alternative in RENAMES.get(key, ()):
            if all(flags.accepts(s.partition("=")[0]) for s in alternative):
                return [t for s in alternative for t in _spell(s, () if "=" in key else values)]
    return None


def express_argv(argv: Sequence[str], flags: FlagSet) -> Expressed:
    """Rewrite each flag the target rejects into an accepted spelling, keeping values and the order of the rest."""
    out: list[str] = []
    notes: list[str] = []
    for flag, values in _entries(argv):
        if flag is None or flags.accepts(flag):
            out += [*([flag] if flag else []), *values]
            continue
        original = " ".join((flag, *values))
        renamed = _rename(flag, values, flags)
        if renamed is None:
            return Expressed(
                None, (*notes, f"cannot express {original}: {flag} not accepted, no known rename")
            )
        bare = [t for t in renamed if _is_flag(t)]
        if len(bare) == len(renamed) and all(t in out for t in bare):
            notes.append(f"dropped {original}: {' '.join(renamed)} already present")
            continue
        out += renamed
        notes.append(f"mapped {original} → {' '.join(renamed)}")
    return Expressed(tuple(out), tuple(notes))


def rejected(argv: Sequence[str], flags: FlagSet) -> list[str]:
    """The option strings of `argv` the target would reject, in order of first appearance."""
    found: list[str] = []
    for flag, _ in _entries(argv):
        if flag is not None and not flags.accepts(flag) and flag not in found:
            found.append(flag)
    return found


def check_ladders(ladders: Mapping[str, Sequence[Rung]], flags: FlagSet) -> list[str]:
    """One line per rung op whose flag the target rejects and RENAMES cannot fix (removals never need one)."""
    lines: list[str] = []
    for key, rungs in ladders.items():
        for i, rung in enumerate(rungs):
            for op in rung.ops:
                if op.verb == "remove":
                    continue
                probe = (
                    [op.flag, op.value]
                    if op.verb == "set"
                    else [op.flag, "1"]
                    if op.verb == "step"
                    else [op.flag]
                )
                if express_argv(probe, flags).argv is None:
                    lines.append(f"ladders.{key}[{i}]: {op.flag} not accepted")
    return lines
