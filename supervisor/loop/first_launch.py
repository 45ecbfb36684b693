"""What a daemon does about a server before launching it the first time: complete the recovery a dead daemon
left unfinished, and set the model family's parsers when the args lack them (instead of a relaunch after a full
model load)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.argv import redact as redact_argv
from policies.parsers_table import ExpectedParsers
from policies.pd import Role
from policies.plan import PARSER_KEY, first_launch_parsers

if TYPE_CHECKING:
    from supervisor.loop.context import Loop


def adopt_interrupted(loop: Loop) -> None:
    """A recovery a dead daemon left unfinished: journaled as interrupted, completed by this daemon's launch."""
    found = loop.owner.interrupted_incident()
    if not found:
        return
    incident = loop.svc.incidents.interrupted(found, loop.clock.wall())
    if incident is not None:
        age = max(0.0, loop.clock.wall() - incident.detected_at)
        loop.owner.open_incident(incident, loop.clock.monotonic() - age)
    loop.svc.save_state()


def fix_parsers(loop: Loop) -> None:
    """`parser_policy = "fix"` and the args lack the family's parsers: the first launch already has them (a
    warning in the journal) instead of a relaunch after a full model load."""
    expected = loop.cfg.expected_parsers()
    fix = first_launch_parsers(
        loop.cfg.args,
        ExpectedParsers(*expected) if expected is not None else None,
        loop.cfg.policy.parser_policy,
        loop.owner.levels,
    )
    if fix is None or loop.cfg.role is Role.ROUTER:
        return
    loop.owner.set_levels(fix.levels, (PARSER_KEY, 1))
    loop.log.warning("launch.parsers_fixed", reason=fix.reason)
    loop.svc.incidents.notice(
        loop.name,
        loop.clock.wall(),
        "parser_misconfig",
        "fixed before launch",
        fix.reason,
        {"probe": "config", "args": redact_argv(list(loop.cfg.args))},
        loop.cfg.argv,
        0,
    )
