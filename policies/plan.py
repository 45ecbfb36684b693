"""What to do about a fault: relaunch (with which ladder rung), alert only, or fail. Pure.

Rung selection follows `policies.ladders.select_rung` (one rung further on each repeat), except for faults whose
first rung is a known cure for a deterministic bug (a TP collective desync, a decode or PD wedge): those go to
rung 1 at the first occurrence, because relaunching into the same bug costs a second outage (DESIGN §6, the
reference's "applied by hand after the second page of the night").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies import argv as argv_reader
from policies.backoff import RestartDecision
from policies.ladders import ArgvDiff, Ladder, PastIncident, Rung, apply_rungs, parse_op, select_rung
from policies.parsers_table import ExpectedParsers, parsers_match
from policies.states import FaultKind

IMMEDIATE_CURE = frozenset({"collective_hang", "decode_wedge", "pd_transfer_wedge"})
PARSER_KEY = "parser_misconfig"


@dataclass(frozen=True)
class Plan:
    """The decision for one incident."""

    action: str  # "relaunch" | "alert" | "fail" | "abort"
    reason: str
    ladder_key: str | None = None
    rung: int = 0
    levels: Mapping[str, int] = field(default_factory=dict)  # every ladder's active level after this plan
    delay_s: float = 0.0
    slow_retry: bool = False
    page: bool = True


def parser_ladder(expected: ExpectedParsers) -> Ladder:
    """The one-rung ladder that sets the family's expected parsers."""
    ops = []
    for flag, value in (("--tool-call-parser", expected.tool), ("--reasoning-parser", expected.reasoning)):
        ops.append(parse_op(f"set {flag} {value}") if value else parse_op(f"remove {flag}"))
    return (Rung(tuple(ops)),)


def parser_mismatches(args: Sequence[str], expected: ExpectedParsers) -> list[str]:
    """How the launch args differ from the family's parsers (aliases agree), one line each; [] when they match."""
    found = []
    for flag, want in (("--tool-call-parser", expected.tool), ("--reasoning-parser", expected.reasoning)):
        have = argv_reader.value(args, flag)
        if not parsers_match(want, have, reasoning=flag == "--reasoning-parser"):
            found.append(f"{flag} is {have or 'unset'}; the model family needs {want or 'it unset'}")
    return found


@dataclass(frozen=True)
class ParserFix:
    """The family's parsers set before the first launch: the levels to launch with, and why."""

    levels: Mapping[str, int]
    reason: str


def first_launch_parsers(
    args: Sequence[str], expected: ExpectedParsers | None, parser_policy: str, levels: Mapping[str, int]
) -> ParserFix | None:
    """With `parser_policy = "fix"`, launch with the family's parsers at once when the args lack them — the
    config check would otherwise relaunch after a full (wasted) model load. None when nothing is to fix."""
    if expected is None or parser_policy != "fix" or levels.get(PARSER_KEY, 0) >= 1:
        return None
    wrong = parser_mismatches(args, expected)
    if not wrong:
        return None
    return ParserFix({**levels, PARSER_KEY: 1}, "; ".join(wrong) + ": launched with the family's parsers")


def build_argv(
    base: Sequence[str], levels: Mapping[str, int], ladders: Mapping[str, Ladder]
) -> tuple[tuple[str, ...], ArgvDiff]:
    """The configured argv with the first `level` rungs of each active ladder applied (in key order)."""
    rungs: list[Rung] = []
    for key in sorted(levels):
        rungs.extend(ladders.get(key, ())[: levels[key]])
    return apply_rungs(base, rungs)


def plan_recovery(
    kind: str,
    ladder_key: str | None,
    history: Sequence[PastIncident],
    levels: Mapping[str, int],
    ladders: Mapping[str, Ladder],
    restart: RestartDecision,
    parser_policy: str = "fix",
    brownout_policy: str = "alert",
) -> Plan:
    """Decide the recovery of a fault of `kind`, given the incidents before it and the active levels."""
    if kind == FaultKind.GPU_FAULT:
        return Plan(
            "fail", "fatal GPU error (Xid): a reboot or drain problem, not a restart problem", levels=levels
        )
    if kind == FaultKind.STREAM_LEAK:
        return Plan(
            "alert", "markup leaks only under concurrent streaming: alert, do not restart", levels=levels
        )
    if kind == FaultKind.PAUSE_OVERRUN:
        return Plan(
            "alert",
            "paused by its client on purpose: alert, do not restart (a restart loses what the client pushed); "
            "degraded until /continue_generation",
            levels=levels,
        )
    if kind == FaultKind.BROWNOUT and brownout_policy == "alert":
        return Plan(
            "alert",
            "slow, not broken: alert, do not restart (brownout_policy = alert); degraded until it clears",
            levels=levels,
        )
    if kind == FaultKind.PARSER_MISCONFIG:
        return _plan_parser(history, levels, ladders, restart, parser_policy)
    new_levels = dict(levels)
    rung, why = 0, "no ladder for this fault: relaunch with the same flags"
    if ladder_key is not None and ladder_key in ladders:
        ladder = ladders[ladder_key]
        prior = [h for h in history if h.kind == ladder_key]
        if not prior and ladder_key.split(":")[0] in IMMEDIATE_CURE and ladder:
            rung, why = 1, f"first {ladder_key}: rung 1 is its known cure: {ladder[0]}"
        else:
            choice = select_rung(ladder_key, history, ladder)
            if choice.index >= len(ladder) and prior and prior[-1].rung >= len(ladder):
                return Plan("fail", f"{choice.reason}; operator needed", ladder_key, choice.index, levels)
            rung, why = choice.index, choice.reason
        new_levels[ladder_key] = max(rung, new_levels.get(ladder_key, 0))
    if not restart.allowed:
        return Plan(
            "fail",
            f"{why}; {restart.reason}",
            ladder_key,
            rung,
            new_levels,
            restart.delay_s,
            restart.slow_retry,
        )
    return Plan("relaunch", f"{why}; {restart.reason}", ladder_key, rung, new_levels, restart.delay_s)


def _plan_parser(
    history: Sequence[PastIncident],
    levels: Mapping[str, int],
    ladders: Mapping[str, Ladder],
    restart: RestartDecision,
    parser_policy: str,
) -> Plan:
    if parser_policy != "fix" or PARSER_KEY not in ladders:
        why = "policy alert" if parser_policy != "fix" else "model family unknown: no expected parsers"
        return Plan("alert", f"parser misconfigured; {why}: fix the launch flags", levels=levels)
    if levels.get(PARSER_KEY, 0) >= 1:
        reverted = {k: v for k, v in levels.items() if k != PARSER_KEY}
        return Plan(
            "fail",
            "the canary still fails with the expected parsers: reverted, operator needed",
            PARSER_KEY,
            0,
            reverted,
        )
    new_levels = {**levels, PARSER_KEY: 1}
    why = f"relaunch with the family's parsers: {ladders[PARSER_KEY][0]}"
    if not restart.allowed:
        return Plan(
            "fail", f"{why}; {restart.reason}", PARSER_KEY, 1, new_levels, restart.delay_s, restart.slow_retry
        )
    return Plan("relaunch", why, PARSER_KEY, 1, new_levels, restart.delay_s, page=False)
