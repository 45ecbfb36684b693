"""One server's entry in `/status`: its state, the running argv against the configured one as flags, what the
next launch changes, one entry per active ladder (secrets redacted)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policies.argv import redact as redact_argv
from policies.model import engine_values
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
        "engine": engine_pause(loop),
        "gateway": loop.svc.gateway.view(loop.name) if loop.svc.gateway is not None else None,
        "probes": loop.watch.snapshot(),
        "startup": loop.watch.startup_view(),
        "last_incident": last.to_json() if last else None,
    }


def engine_pause(loop: Loop) -> dict[str, Any] | None:
    """While SGLang reports its engine paused by its client: for how long, memory released, the bound."""
    engine = loop.watch.latest("engine")
    if engine is None or not engine_values(engine).get("paused"):
        return None
    v = engine_values(engine)
    since = v.get("paused_since")
    lasted = loop.clock.monotonic() - since if since is not None else 0.0
    return {
        "paused_s": round(max(lasted, 0.0), 1),
        "max_pause_s": loop.cfg.probes.max_pause_s,
        "memory_released": bool(v.get("memory_released")),
        "evidence": engine.detail,
    }


def engine_pause_line(loop: Loop) -> str:
    """Why a paused engine is not ready, in one line ('' when not paused)."""
    pause = engine_pause(loop)
    if pause is None:
        return ""
    released = ", memory released" if pause["memory_released"] else ""
    return f"engine paused by its client for {pause['paused_s']:.0f}s{released} (SGLang's /ready is 503)"
