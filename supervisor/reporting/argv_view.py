"""What `/status` says about a server's flags: the configured argv against the running one, what the next launch
changes, and each active ladder's rung with what it adds and removes.

Every argv is masked (`policies.argv.redact`) before it is compared, so a secret never reaches a diff; a key that
changed shows as unchanged (`***` both sides).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.argv import redact
from policies.ladders import ArgvDiff, Ladder, apply_rungs, diff_args

NEXT_LAUNCH = "takes effect at next launch"


def flag_diff(before: Sequence[str], after: Sequence[str]) -> dict[str, list[Any]]:
    """`added` [flag, values], `removed` [flag, values], `changed` [flag, old, new] from `before` to `after`."""
    return _json(diff_args(redact(before), redact(after)))


def _json(diff: ArgvDiff) -> dict[str, list[Any]]:
    return {
        "added": [[flag, list(values)] for flag, values in diff.added],
        "removed": [[flag, list(values)] for flag, values in diff.removed],
        "changed": [[flag, list(old), list(new)] for flag, old, new in diff.changed],
    }


def next_launch(running: Sequence[str], upcoming: Sequence[str]) -> dict[str, Any]:
    """What the next launch changes against the running argv (a reload, a rung set or reset): its argv, the
    diff, and `pending` with the note while they differ."""
    diff = flag_diff(running, upcoming)
    pending = any(diff.values())
    return {"argv": redact(upcoming), **diff, "pending": pending, "note": NEXT_LAUNCH if pending else ""}


def rungs(
    args: Sequence[str], levels: Mapping[str, int], ladders: Mapping[str, Ladder]
) -> list[dict[str, Any]]:
    """One entry per active ladder: its key, level, rungs in the ladder, and what its first `level` rungs do to
    the configured `args` on their own (`added`, `removed`, `changed`, `ops`)."""
    out = []
    for key in sorted(levels):
        ladder = ladders.get(key, ())
        level = levels[key]
        _, diff = apply_rungs(redact(args), ladder[:level])
        out.append(
            {
                "key": key,
                "level": level,
                "of": len(ladder),
                "ops": [str(rung) for rung in ladder[:level]],
                **_json(diff),
            }
        )
    return out


def ladder_table(ladders: Mapping[str, Ladder]) -> dict[str, list[str]]:
    """Every ladder of the server, each rung as its ops (what `rung set` may choose from)."""
    return {key: [str(rung) for rung in ladder] for key, ladder in sorted(ladders.items())}


def diff_words(diff: Mapping[str, Sequence[Any]]) -> list[str]:
    """`+--flag`, `+(--flag value)`, `-(--flag)`, `-(--flag value)`, `~--flag old → new`: one word per change
    (a removed flag in parentheses, so `-` never runs into its dashes)."""

    def shown(flag: str, values: Sequence[str], bare: bool = True) -> str:
        return flag if bare and not values else f"({' '.join([flag, *values])})"

    words = [f"+{shown(flag, values)}" for flag, values in diff.get("added", ())]
    words += [f"-{shown(flag, values, bare=False)}" for flag, values in diff.get("removed", ())]
    words += [
        f"~{flag} {' '.join(old) or '(set)'} → {' '.join(new) or '(set)'}"
        for flag, old, new in diff.get("changed", ())
    ]
    return words
