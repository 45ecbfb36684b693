"""One server's entry in `/status`: its state, the running argv against the configured one as flags, what the
next launch changes, one entry per active ladder (secrets redacted)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policies.argv import redact as redact_argv
from supervisor.reporting import argv_view

if TYPE_CHECKING:
    from supervisor.loop.context import Loop


def server_status(loop: Loop) -> dict[str, Any]:
    """This server in `/status` (secrets redacted): the running argv against the configured one as flags,
    what the next launch changes, one entry per active ladder."""
    owner = loop.owner
    last = loop.svc.incidents.last(loop.name)
    running, configured = list(owner.argv), list(loop.cfg.argv)
    flags = argv_view.flag_diff(configured, running)
    ladders = loop.ladders
    run = owner.run
    return {
        "name": loop.name,
        "role": loop.cfg.role.value,
        "state": owner.state.value,
        "since": owner.since,
        "reason": owner.reason,
        "unproven": owner.unproven or None,
        "pid": run.pid if run else None,
        "run_id": owner.run_id or None,
        "argv": redact_argv(running),
        "configured_argv": redact_argv(configured),
        "flags": flags,
        "next_launch": argv_view.next_launch(running, loop.current_argv()),
        "gpus": list(loop.cfg.gpus),
        "restarts": owner.restart_count,
        "adopted": owner.adopted,
        "fallback": {
            "rung": owner.rung,
            "levels": owner.levels,
            "reason": last.reason if last else "",
            "flags": argv_view.diff_words(flags),
            "rungs": argv_view.rungs(loop.cfg.args, owner.levels, ladders),
            "ladders": argv_view.ladder_table(ladders),
        },
        "engine": loop.watch.engine_pause(),
        "probes": loop.watch.snapshot(),
        "startup": loop.watch.startup_view(),
        "last_incident": last.to_json() if last else None,
    }
