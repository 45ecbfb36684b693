"""SGLang's argv read the way its argparse parser reads it. Pure: the one reader every module uses.

Rules (Python 3.11 argparse over `ServerArgs.add_cli_args`, the table in `policies.sglang_flags`):
- the last occurrence of an option wins; aliases (`--tp-size`/`--tensor-parallel-size`) are one option;
- `--flag value` and `--flag=value`; a switch (`store_true`, `--x`/`--no-x`) takes no value;
- a long option may be abbreviated to any prefix that names exactly one option string (`--tp` is
  `--tp-size`); an ambiguous prefix (`--cuda-graph-max-bs`) is an error for SGLang and is read here as
  an option we do not know;
- a token is a value, not an option, when it is a negative number (`-0.05`) or holds a space; after a
  bare `--` nothing is an option.

An option the table does not know (another SGLang version's, a router's) keeps its `--flag=value` value,
or takes the tokens that follow it up to the next option. `EXACT` is a table that knows nothing, for
command lines that are not SGLang's `launch_server` (the router's).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies import sglang_flags

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_SECRET_NAME = re.compile(r"key|token|secret|passw|credential", re.IGNORECASE)
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
REDACTED = "***"
_UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Option:
    """One option string: its action's key (the first option string), how many values, its polarity."""

    key: str
    arity: str  # "0", "1", "?", "*", "+" (argparse's nargs; "unknown" when the table lacks it)
    negated: bool = False


@dataclass(frozen=True, slots=True)
class FlagTable:
    """The option strings a parser declares (empty: every option is read as unknown)."""

    options: Mapping[str, Option]
    secrets: frozenset[str] = frozenset()
    _sorted: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sorted", tuple(sorted(self.options)))

    def resolve(self, written: str) -> str | None:
        """The option string `written` names: itself, or the one long option it abbreviates uniquely."""
        if written in self.options:
            return written
        if not written.startswith("--"):
            return None
        first = bisect.bisect_left(self._sorted, written)
        matches = self._sorted[first : first + 2]
        if (
            matches
            and matches[0].startswith(written)
            and not (len(matches) > 1 and matches[1].startswith(written))
        ):
            return matches[0]
        return None


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One option in an argv.

    `option` is the full option string it resolves to (`--tp-size` for `--tp`; the written spelling when
    unknown), `key` its action's first option string, `values` what the parser stores for it, `start` the
    index of the option token and `tokens` every token from there up to the next option (strays included).
    """

    written: str
    option: str
    key: str
    values: tuple[str, ...]
    start: int
    tokens: tuple[str, ...]
    explicit: bool
    known: bool
    negated: bool = False


def _table(groups: Mapping[str, str], secrets: Sequence[str]) -> FlagTable:
    options: dict[str, Option] = {}
    for arity, text in groups.items():
        for word in text.split():
            spellings = word.split("|")
            for spelling in spellings:
                negated = spelling.startswith("--no-") and f"--{spelling[5:]}" in spellings
                options[spelling] = Option(spellings[0], arity, negated)
    return FlagTable(options, frozenset(secrets))


SGLANG = _table(
    {
        "0": sglang_flags.SWITCHES,
        "1": sglang_flags.ONE_VALUE,
        "?": sglang_flags.OPTIONAL_VALUE,
        "*": sglang_flags.ANY_VALUES,
        "+": sglang_flags.SOME_VALUES,
    },
    SECRET_FLAGS,
)
EXACT = FlagTable({})


def _classify(token: str, table: FlagTable) -> tuple[str, str, str | None] | None:
    """(written option, resolved option or "" when unknown, explicit value) — None for a value token."""
    if not token.startswith("-") or token == "-":
        return None
    if token in table.options:
        return token, token, None
    head, eq, tail = token.partition("=")
    if eq and head in table.options:
        return head, head, tail
    if token.startswith("--"):
        resolved = table.resolve(head)
        if resolved is not None:
            return head, resolved, tail if eq else None
    elif token[:2] in table.options:
        return token[:2], token[:2], token[2:]
    if _NEGATIVE_NUMBER.match(token) or " " in token:
        return None
    return (head, "", tail) if eq and token.startswith("--") else (token, "", None)


def _take(arity: str, following: int) -> int:
    """How many of the value tokens that follow an option it takes (an unknown option takes them all)."""
    if arity == "0":
        return 0
    if arity in ("1", "?"):
        return min(1, following)
    return following


def scan(argv: Sequence[str], table: FlagTable = SGLANG) -> list[Occurrence]:
    """Every option of `argv` in order, with the values the parser would store for it."""
    found: list[tuple[int, tuple[str, str, str | None]]] = []
    for i, token in enumerate(argv):
        if token == "--":
            break
        kind = _classify(token, table)
        if kind is not None:
            found.append((i, kind))
    out: list[Occurrence] = []
    for n, (start, (written, resolved, explicit)) in enumerate(found):
        end = found[n + 1][0] if n + 1 < len(found) else len(argv)
        tokens = tuple(argv[start:end])
        spec = table.options.get(resolved)
        arity = spec.arity if spec else _UNKNOWN
        following = tokens[1 : tokens.index("--")] if "--" in tokens else tokens[1:]
        if explicit is not None:
            values: tuple[str, ...] = () if arity == "0" else (explicit,)
        else:
            values = following[: _take(arity, len(following))]
        out.append(
            Occurrence(
                written=written,
                option=resolved or written,
                key=spec.key if spec else written,
                values=values,
                start=start,
                tokens=tokens,
                explicit=explicit is not None,
                known=spec is not None,
                negated=spec.negated if spec else False,
            )
        )
    return out


def key(flag: str, table: FlagTable = SGLANG) -> str:
    """The action key of `flag` (`--tp` → `--tp-size`, `--model` → `--model-path`); `flag` when unknown."""
    resolved = table.resolve(flag)
    return table.options[resolved].key if resolved is not None else flag


def last(argv: Sequence[str], flag: str, table: FlagTable = SGLANG) -> Occurrence | None:
    """The last occurrence of the option `flag` names (any alias or abbreviation of it)."""
    want = key(flag, table)
    return next((o for o in reversed(scan(argv, table)) if o.key == want), None)


def values(argv: Sequence[str], flag: str, table: FlagTable = SGLANG) -> tuple[str, ...] | None:
    """The values the parser keeps for `flag` (its last occurrence's); None when it is not given."""
    found = last(argv, flag, table)
    return None if found is None else found.values


def value(argv: Sequence[str], flag: str, table: FlagTable = SGLANG) -> str | None:
    """The value of `flag`'s last occurrence; None when absent or given without a value."""
    found = values(argv, flag, table)
    return found[-1] if found else None


def present(argv: Sequence[str], flag: str, table: FlagTable = SGLANG) -> bool:
    """True when `flag` is given; for a `--x`/`--no-x` pair, when its last occurrence is this spelling."""
    found = last(argv, flag, table)
    if found is None:
        return False
    resolved = table.resolve(flag)
    negated = table.options[resolved].negated if resolved is not None else False
    return found.negated == negated


def _is_secret(occurrence: Occurrence, table: FlagTable) -> bool:
    if occurrence.known:
        return occurrence.option in table.secrets
    return bool(_SECRET_NAME.search(occurrence.written.lstrip("-")))


def redact(argv: Sequence[str], table: FlagTable = SGLANG) -> list[str]:
    """`argv` with the values of secret-bearing options (`--api-key X`, `--api-key=X`) replaced by `***`.

    Known options are secret when the table says so; an unknown option when its name holds key, token,
    secret, password or credential. Every token a secret option may have taken is hidden.
    """
    out = list(argv)
    for occurrence in scan(argv, table):
        if not _is_secret(occurrence, table):
            continue
        if occurrence.explicit:
            out[occurrence.start] = f"{occurrence.written}={REDACTED}"
        for offset in range(1, len(occurrence.tokens)):
            out[occurrence.start + offset] = REDACTED
    return out
