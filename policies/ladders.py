"""Fallback-flag ladders as data (DESIGN §6, failure-modes §6–§7, aesthetics lesson 9).

A ladder is an ordered tuple of rungs; a rung is a tuple of ops on SGLang's argv. Level 0 means the
configured argv; level *n* means the first *n* rungs applied in order (rungs accumulate). Ops, as
written in TOML:

    add --flag                                  the flag, without a value, if absent
    remove --flag | remove --prefix-*           every occurrence, with its values
    set --flag VALUE                            one occurrence, with this value
    step --flag -0.05 floor=0.5 start=0.88      add a (negative) delta, never below floor
    step --flag *0.5 floor=1024 start=8192      multiply by a factor in (0, 1), never below floor

`start` is the value assumed when the flag is unset. A step that is already at or below its floor
changes nothing. Flags are matched as SGLang's parser reads `args` (`policies.argv`): an alias or an
unambiguous prefix (`--mem-frac` for `--mem-fraction-static`, `--tp` for `--tp-size`) is the same flag.
Ladder keys are fault kinds, optionally qualified by an evidence tag (`crash:spec_decode`);
the qualified ladder wins when the diagnosis carries that tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from policies import argv
from policies.states import FaultKind

_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
_PATTERN = re.compile(r"--[a-z0-9][a-z0-9-]*\*?")
_KEY = re.compile(r"([a-z_]+)(?::([a-z0-9_]+))?")
_KINDS = frozenset(k.value for k in FaultKind)


@dataclass(frozen=True, slots=True)
class Op:
    """One change to an argv: `add`, `remove`, `set` or `step` (see the module docstring)."""

    verb: str
    flag: str
    value: str = ""
    amount: float = 0.0
    multiply: bool = False
    floor: float = 0.0
    start: float = 0.0

    def __str__(self) -> str:
        if self.verb == "set":
            return f"set {self.flag} {self.value}"
        if self.verb == "step":
            amount = f"*{self.amount:g}" if self.multiply else f"{self.amount:g}"
            return f"step {self.flag} {amount} floor={self.floor:g} start={self.start:g}"
        return f"{self.verb} {self.flag}"


@dataclass(frozen=True, slots=True)
class Rung:
    """The ops one step down a ladder applies, in order."""

    ops: tuple[Op, ...]

    def __str__(self) -> str:
        return "; ".join(str(op) for op in self.ops)


Ladder = tuple[Rung, ...]


@dataclass(frozen=True, slots=True)
class LadderIssue:
    """A validation error: `path` relative to the ladders table (`oom[1][0]`), the value, what is allowed."""

    path: str
    value: object
    allowed: str


@dataclass(frozen=True, slots=True)
class PastIncident:
    """What `select_rung` needs of an earlier incident: its ladder key and the level chosen for it."""

    kind: str
    rung: int


@dataclass(frozen=True, slots=True)
class RungChoice:
    """The ladder level to relaunch with (0 = configured argv) and why."""

    index: int
    reason: str


@dataclass(frozen=True, slots=True)
class ArgvDiff:
    """Flags added, removed and changed between two argvs; values are the last occurrence's."""

    added: tuple[tuple[str, tuple[str, ...]], ...] = ()
    removed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    changed: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = ()

    def lines(self) -> tuple[str, ...]:
        """One human line per change: `+--flag v`, `---flag v`, `~--flag old → new`."""
        out = [f"+{_show(f, v)}" for f, v in self.added]
        out += [f"-{_show(f, v)}" for f, v in self.removed]
        out += [
            f"~{f} {' '.join(old) or '(set)'} → {' '.join(new) or '(set)'}" for f, old, new in self.changed
        ]
        return tuple(out)


def _show(flag: str, values: tuple[str, ...]) -> str:
    return " ".join((flag, *values))


_ALLOWED_OP = (
    "'add --flag', 'remove --flag[*]', 'set --flag VALUE', "
    "'step --flag -DELTA|*FACTOR floor=N start=N' (flags lowercase, '--' then letters, digits, '-')"
)


def parse_op(text: str) -> Op:
    """Parse one op; raises ValueError naming what is allowed."""
    words = text.split()
    if len(words) < 2 or words[0] not in ("add", "remove", "set", "step"):
        raise ValueError(_ALLOWED_OP)
    verb, flag, rest = words[0], words[1], words[2:]
    if not (_PATTERN if verb == "remove" else _FLAG).fullmatch(flag):
        raise ValueError(f"malformed flag {flag!r}; {_ALLOWED_OP}")
    if verb in ("add", "remove"):
        if rest:
            raise ValueError(f"'{verb}' takes a flag and nothing else")
        return Op(verb, flag)
    if verb == "set":
        if len(rest) != 1 or rest[0].startswith("--"):
            raise ValueError("'set' takes a flag and one value")
        return Op(verb, flag, value=rest[0])
    return _parse_step(flag, rest)


def _parse_step(flag: str, rest: list[str]) -> Op:
    options = dict(w.split("=", 1) for w in rest[1:] if "=" in w)
    if len(rest) != 3 or set(options) != {"floor", "start"}:
        raise ValueError("'step' takes a flag, -DELTA or *FACTOR, floor=N and start=N")
    multiply = rest[0].startswith("*")
    try:
        amount = float(rest[0].removeprefix("*"))
        floor, start = float(options["floor"]), float(options["start"])
    except ValueError as exc:
        raise ValueError(f"'step' numbers must be numbers: {exc}") from exc
    if not (0.0 < amount < 1.0 if multiply else amount < 0.0):
        raise ValueError("'step' goes down: a negative delta or a factor in (0, 1)")
    if start < floor:
        raise ValueError("'step' start must be at least floor")
    return Op("step", flag, amount=amount, multiply=multiply, floor=floor, start=start)


def parse_ladders(raw: Mapping[str, object]) -> tuple[dict[str, Ladder], list[LadderIssue]]:
    """Validate a `{key: [[op, ...], ...]}` table; returns the ladders and every issue found."""
    ladders: dict[str, Ladder] = {}
    issues: list[LadderIssue] = []
    for key, rungs_raw in raw.items():
        match = _KEY.fullmatch(key)
        if match is None or match.group(1) not in _KINDS:
            issues.append(
                LadderIssue(key, key, f"a fault kind ({', '.join(sorted(_KINDS))}), optionally ':tag'")
            )
            continue
        if not isinstance(rungs_raw, list | tuple) or not rungs_raw:
            issues.append(
                LadderIssue(key, rungs_raw, "a non-empty list of rungs (omit the key for the default)")
            )
            continue
        rungs: list[Rung] = []
        for i, rung_raw in enumerate(rungs_raw):
            rung = _parse_rung(f"{key}[{i}]", rung_raw, issues)
            if rung is None:
                continue
            repeatable = any(op.verb == "step" for op in rung.ops)
            if rung in rungs and not repeatable:
                issues.append(LadderIssue(f"{key}[{i}]", str(rung), "a rung not already on the ladder"))
            rungs.append(rung)
        ladders[key] = tuple(rungs)
    return ladders, issues


def _parse_rung(path: str, raw: object, issues: list[LadderIssue]) -> Rung | None:
    if not isinstance(raw, list | tuple) or not raw:
        issues.append(LadderIssue(path, raw, "a non-empty list of op strings"))
        return None
    ops: list[Op] = []
    for j, text in enumerate(raw):
        try:
            if not isinstance(text, str):
                raise ValueError(_ALLOWED_OP)
            ops.append(parse_op(text))
        except ValueError as exc:
            issues.append(LadderIssue(f"{path}[{j}]", text, str(exc)))
    return Rung(tuple(ops)) if len(ops) == len(raw) else None


def ladder_key(kind: FaultKind, tags: Iterable[str], ladders: Mapping[str, Ladder]) -> str | None:
    """The ladder that applies to a fault: `kind:tag` for the first tag that has one, else `kind`."""
    for tag in tags:
        if f"{kind}:{tag}" in ladders:
            return f"{kind}:{tag}"
    return kind.value if kind.value in ladders else None


def select_rung(kind: str, history: Sequence[PastIncident], ladder: Ladder) -> RungChoice:
    """Level for the relaunch after a fault of ladder key `kind`: one rung further on each repeat.

    The first fault of a kind relaunches at level 0 (it may be transient); every later one moves one
    rung past the level chosen last time, until the ladder is exhausted.
    """
    prior = [h.rung for h in history if h.kind == kind]
    if not prior:
        return RungChoice(0, f"first {kind}: relaunch with the configured flags")
    current = prior[-1]
    if current >= len(ladder):
        return RungChoice(len(ladder), f"{kind} again; ladder exhausted at rung {len(ladder)}")
    index = current + 1
    return RungChoice(index, f"{kind} repeated ({len(prior) + 1}x): rung {index}: {ladder[index - 1]}")


# ---- argv model: entries as `policies.argv` reads them (leading positionals first, as an entry without a key)


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str | None  # the option's action key; `--no-x` for the negative of a pair; None: leading tokens
    option: str
    values: tuple[str, ...]
    tokens: tuple[str, ...]


def _new(flag: str, value: str | None = None, eq: bool = False) -> _Entry:
    resolved = argv.SGLANG.resolve(flag)
    spec = argv.SGLANG.options[resolved] if resolved is not None else None
    name = flag if spec is None else (resolved if spec.negated else spec.key)
    if value is None:
        return _Entry(name, resolved or flag, (), (flag,))
    return _Entry(name, resolved or flag, (value,), (f"{flag}={value}",) if eq else (flag, value))


def _split(args: Sequence[str]) -> list[_Entry]:
    found = argv.scan(args)
    lead = tuple(args[: found[0].start] if found else args)
    entries = [_Entry(None, "", lead, lead)] if lead else []
    for o in found:
        entries.append(_Entry(o.option if o.negated else o.key, o.option, o.values, o.tokens))
    return entries


def _join(entries: Iterable[_Entry]) -> tuple[str, ...]:
    return tuple(t for e in entries for t in e.tokens)


def _effective(entries: Iterable[_Entry]) -> dict[str, tuple[str, ...]]:
    """Option → values of its last occurrence (what argparse keeps), in order of first appearance."""
    seen: dict[str, tuple[str, ...]] = {}
    for e in entries:
        if e.name is not None:
            seen[e.name] = e.values
    return seen


def _matches(entry: _Entry, pattern: str) -> bool:
    if entry.name is None:
        return False
    if pattern.endswith("*"):
        return entry.option.startswith(pattern[:-1]) or entry.name.startswith(pattern[:-1])
    return argv.key(entry.option) == argv.key(pattern)


def _set(entries: list[_Entry], flag: str, value: str) -> list[_Entry]:
    name = _new(flag).name
    first = next((i for i, e in enumerate(entries) if e.name == name), None)
    if first is None:
        return [*entries, _new(flag, value)]
    kept = [e for i, e in enumerate(entries) if e.name != name or i == first]
    kept[first] = _new(flag, value, eq="=" in entries[first].tokens[0])
    return kept


def _step(entries: list[_Entry], op: Op) -> list[_Entry]:
    values = _effective(entries).get(str(_new(op.flag).name))
    text = values[-1] if values else None
    try:
        current = op.start if text is None else float(text)
    except ValueError:
        return entries
    if current <= op.floor:
        return entries
    stepped = current * op.amount if op.multiply else current + op.amount
    new = max(op.floor, stepped)
    whole = all(float(x).is_integer() for x in (op.floor, op.start, current))
    whole = whole and (op.multiply or op.amount.is_integer()) and (text is None or text.lstrip("-").isdigit())
    return _set(entries, op.flag, str(int(new)) if whole else f"{round(new, 6):g}")


def _apply_op(entries: list[_Entry], op: Op) -> list[_Entry]:
    if op.verb == "add":
        added = _new(op.flag)
        return entries if added.name in _effective(entries) else [*entries, added]
    if op.verb == "remove":
        return [e for e in entries if not _matches(e, op.flag)]
    if op.verb == "set":
        return _set(entries, op.flag, op.value)
    return _step(entries, op)


def diff_args(before: Sequence[str], after: Sequence[str]) -> ArgvDiff:
    """Compare the effective flags of two argvs."""
    old, new = _effective(_split(before)), _effective(_split(after))
    return ArgvDiff(
        added=tuple((f, v) for f, v in new.items() if f not in old),
        removed=tuple((f, v) for f, v in old.items() if f not in new),
        changed=tuple((f, old[f], v) for f, v in new.items() if f in old and old[f] != v),
    )


def apply_rungs(argv: Sequence[str], rungs: Iterable[Rung]) -> tuple[tuple[str, ...], ArgvDiff]:
    """Apply every op of `rungs` in order to SGLang's `argv`; returns the new argv and what changed."""
    entries = _split(argv)
    for rung in rungs:
        for op in rung.ops:
            entries = _apply_op(entries, op)
    new_argv = _join(entries)
    return new_argv, diff_args(argv, new_argv)


_DEFAULT_RAW: dict[str, object] = {
    "collective_hang": [
        ["add --disable-overlap-schedule"],
        ["add --disable-custom-all-reduce"],
        ["set --cuda-graph-backend-decode disabled"],
    ],
    "decode_wedge": [
        ["add --disable-overlap-schedule"],
        ["add --disable-custom-all-reduce"],
        ["set --cuda-graph-backend-decode disabled"],
    ],
    "collective_hang:spec_decode": [
        ["remove --speculative-*"],
        ["add --disable-overlap-schedule"],
        ["add --disable-custom-all-reduce"],
    ],
    "decode_wedge:spec_decode": [
        ["remove --speculative-*"],
        ["add --disable-overlap-schedule"],
        ["add --disable-custom-all-reduce"],
    ],
    "crash:spec_decode": [["remove --speculative-*"]],
    "crash:illegal_memory_access": [
        ["add --disable-overlap-schedule"],
        ["set --cuda-graph-backend-decode disabled", "set --cuda-graph-backend-prefill disabled"],
    ],
    "pd_transfer_wedge": [["add --disable-overlap-schedule"]],
    "oom": [
        ["step --mem-fraction-static -0.05 floor=0.5 start=0.88"],
        ["step --mem-fraction-static -0.05 floor=0.5 start=0.88"],
        ["step --mem-fraction-static -0.05 floor=0.5 start=0.88"],
        ["step --chunked-prefill-size *0.5 floor=1024 start=8192"],
        ["step --chunked-prefill-size *0.5 floor=1024 start=8192"],
    ],
}


def _defaults() -> dict[str, Ladder]:
    ladders, issues = parse_ladders(_DEFAULT_RAW)
    if issues:
        raise ValueError(f"invalid default ladders: {issues}")
    return ladders


DEFAULT_LADDERS: dict[str, Ladder] = _defaults()
