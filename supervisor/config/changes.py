"""What a reload (SIGHUP) can apply to a running daemon, and what only a restart can (docs/config.md, Reload).

A reload applies `[alerts]` (the sinks are rebuilt, their secret files re-read), the control token,
`[supervisor.restart]`, the tick and release settings, and per server `probes` at once, `policy` at the next
decision, `command`, `args`, `env`, `ports` and timeouts at the next launch. Everything else was built when the
daemon started (its directories, GPU backend, status server, server loops and their start order, the group
member): `restart_needed` names each such change, and the reload is refused as a whole. A field not listed as
live here needs a restart, so a new setting is never silently ignored by a reload.
"""

from __future__ import annotations

from pydantic import BaseModel

from supervisor.config.models import Config

LIVE_SUPERVISOR = frozenset(
    {"tick_s", "gpu_mem_free_threshold_mib", "release_deadline_s", "allowlist", "shm_dir", "restart", "http"}
)
LIVE_HTTP = frozenset({"token_file", "allow_public_without_token"})
LIVE_SERVER = frozenset(
    {
        "command",
        "args",
        "env",
        "ports",
        "startup_budget_s",
        "startup_silence_s",
        "drain_grace_s",
        "api_key_file",
        "probes",
        "policy",
    }
)


def _fixed(at: str, old: BaseModel, new: BaseModel, live: frozenset[str]) -> list[str]:
    return [
        f"{at}.{k}" for k in type(old).model_fields if k not in live and getattr(old, k) != getattr(new, k)
    ]


def restart_needed(old: Config, new: Config) -> list[str]:
    """The dotted paths of changes from `old` to `new` that only a daemon restart applies."""
    paths = _fixed("supervisor", old.supervisor, new.supervisor, LIVE_SUPERVISOR)
    paths += _fixed("supervisor.http", old.supervisor.http, new.supervisor.http, LIVE_HTTP)
    names_old = [s.name for s in old.servers]
    names_new = [s.name for s in new.servers]
    added = [n for n in names_new if n not in names_old]
    removed = [n for n in names_old if n not in names_new]
    if added or removed:
        paths.append(f"servers (added: {added or 'none'}; removed: {removed or 'none'})")
    for i, server in enumerate(new.servers):
        if server.name in names_old:
            paths += _fixed(f"servers[{i}]", old.server(server.name), server, LIVE_SERVER)
    paths += [k for k in ("group", "gateway") if getattr(old, k) != getattr(new, k)]
    return paths


def changed_sections(old: Config, new: Config) -> list[str]:
    """The tables that differ between `old` and `new`, for the log: `supervisor.http`, `servers[0]`, `alerts`..."""
    out = [
        f"supervisor.{k}"
        for k in ("http", "restart")
        if getattr(old.supervisor, k) != getattr(new.supervisor, k)
    ]
    if any(
        getattr(old.supervisor, k) != getattr(new.supervisor, k)
        for k in type(old.supervisor).model_fields
        if k not in ("http", "restart")
    ):
        out.insert(0, "supervisor")
    names_old = [s.name for s in old.servers]
    out += [
        f"servers[{i}]"
        for i, server in enumerate(new.servers)
        if server.name not in names_old or old.server(server.name) != server
    ]
    out += [k for k in ("alerts", "group", "gateway") if getattr(old, k) != getattr(new, k)]
    return out
