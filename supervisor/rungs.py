"""Rungs live: an operator moves a server along a fallback ladder without stopping the daemon.

`sglang-supervisor rung show|reset|set --server S [--ladder KEY] [--level N] [--restart]`: `show` reads `/status`;
`set` and `reset` go through the token-gated `POST /control/rung`, are checked by the daemon (`check_rung`:
unknown ladder or a level past the ladder's end is refused with what is allowed), and are applied by the
server's loop through its owner — journaled as an `operator` entry with who and why — for the next launch, or at
once with `--restart` (a planned restart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from supervisor.loop.commands import Command, RungChange

if TYPE_CHECKING:
    from supervisor.loop.context import Loop

ACTIONS = ("show", "reset", "set")


class RungRefused(ValueError):
    """A rung request that cannot be applied (400), with why and what is allowed."""


def parse_request(body: Mapping[str, Any]) -> tuple[str, RungChange]:
    """The server and the change a `POST /control/rung` body asks for; RungRefused naming the bad field."""
    action = body.get("action")
    if action not in ("set", "reset"):
        raise RungRefused(f"action: got {action!r}; 'set' or 'reset' ('show' is GET /status)")
    server = body.get("server")
    if not isinstance(server, str) or not server:
        raise RungRefused("server: a server's name is required (rungs are per server)")
    ladder = body.get("ladder")
    if ladder is not None and not isinstance(ladder, str):
        raise RungRefused(f"ladder: got {ladder!r}; a ladder key such as 'collective_hang'")
    restart = body.get("restart", False)
    if not isinstance(restart, bool):
        raise RungRefused(f"restart: got {restart!r}; true or false")
    if action == "reset":
        return server, RungChange(ladder, 0, restart)
    level = body.get("level")
    if ladder is None or isinstance(level, bool) or not isinstance(level, int):
        raise RungRefused("set needs ladder (a key) and level (an integer; 0 = the configured flags)")
    return server, RungChange(ladder, level, restart)


def check_rung(
    server: str,
    role: str,
    ladders: Mapping[str, Sequence[object]],
    change: RungChange,
    group_member: bool,
) -> None:
    """RungRefused when `change` cannot apply to `server`: a router (no ladders), a multi-node group's member
    (the group holds its levels), an unknown ladder, a level below 0 or past the ladder's last rung."""
    if role == "router":
        raise RungRefused(f"{server} is a router: fallback ladders apply to SGLang servers only")
    if group_member:
        raise RungRefused(f"{server} is a multi-node group's member: its rungs are the group's")
    if change.ladder is None:
        return
    if change.ladder not in ladders:
        known = ", ".join(sorted(ladders)) or "none"
        raise RungRefused(f"ladder: {change.ladder!r} is not a ladder of {server}; its ladders: {known}")
    rungs = len(ladders[change.ladder])
    if not 0 <= change.level <= rungs:
        raise RungRefused(f"level: got {change.level}; {change.ladder} has {rungs} rung(s): 0 to {rungs}")


def show_lines(server: Mapping[str, Any]) -> list[str]:
    """`rung show` for one server of `/status`: each ladder, its level, and the rungs it holds."""
    from supervisor.reporting.argv_view import diff_words

    fallback = server.get("fallback") or {}
    levels = fallback.get("levels") or {}
    lines = [f"{server['name']}: {server.get('state', '?')}"]
    for key, ops in (fallback.get("ladders") or {}).items():
        level = int(levels.get(key, 0))
        lines.append(f"  {key}: rung {level} of {len(ops)}")
        lines += [f"    {'*' if i < level else ' '} {i + 1}: {op}" for i, op in enumerate(ops)]
    pending = server.get("next_launch") or {}
    if pending.get("pending"):
        lines.append(f"  next launch: {'  '.join(diff_words(pending))}  ({pending.get('note', '')})")
    return lines


def apply_rung(loop: Loop, cmd: Command, change: RungChange) -> None:
    """An operator's ladder level, through the owner (journaled with who and why) for the next launch; with
    `restart` the command goes on as a planned restart. The history records the level, so a returning fault
    steps one rung past it."""
    levels = loop.owner.levels
    keys = [change.ladder] if change.ladder is not None else sorted(levels)
    for key in keys:
        loop.owner.set_levels({**levels, key: change.level}, (key, change.level))
        levels = loop.owner.levels
    what = ", ".join(f"{key} {change.level}" for key in keys) or "no active ladder"
    loop.operator_entry(f"rung {what}", cmd)
    if change.restart:
        cmd.kind = "restart"  # carried out as an operator restart, with the new levels
