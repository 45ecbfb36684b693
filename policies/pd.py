"""Prefill/decode ordering (DESIGN §3, failure-modes F3/F5).

- A decode fault restarts that decode only; a healthy prefill is left alone.
- A decode whose requests wait for KV while a prefill is down or stalled waits too: the prefill is the cause
  (`prefill_blamed`), and SGLang fails the decode's requests bound to a dead prefill by itself (its heartbeat).
- A prefill is relaunched only once its decodes have dropped the old one: SGLang's decode forgets a prefill after
  `HEARTBEAT_MAX_FAILURE` missed heartbeats `HEARTBEAT_INTERVAL` s apart and keeps its endpoints otherwise, so a
  prefill back within that window is never bootstrapped (found on the real pair: a planned restart with a 5 s drain
  left the decode stale). The relaunch waits out the window (`relaunch_hold_s`) from the old tree's release.
- A relaunched prefill proves the pair with its canary; only a pair that stays unproven with a decode up
  restarts that decode (it kept the old prefill's endpoints after all).
- The router is restarted only for its own fault; a unified server only for its own.
- Start order: prefills before decodes, every worker before the routers, and explicit `depends_on`
  edges on top. Stop in the reverse order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from policies.model import Fault, Observation, make_fault, progress_values


class Role(StrEnum):
    """What a server is in the deployment."""

    UNIFIED = "unified"
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"


# (earlier, later) role pairs ordered implicitly; unified servers have no implicit order among workers.
_IMPLICIT = frozenset(
    {
        (Role.PREFILL, Role.DECODE),
        (Role.PREFILL, Role.ROUTER),
        (Role.DECODE, Role.ROUTER),
        (Role.UNIFIED, Role.ROUTER),
    }
)


def restart_order(faulted: str, roles: Mapping[str, Role]) -> tuple[str, ...]:
    """Servers to restart, in order, when `faulted` must be restarted."""
    if faulted not in roles:
        raise KeyError(f"unknown server {faulted!r}")
    if roles[faulted] is not Role.PREFILL:
        return (faulted,)
    return (faulted, *(name for name, role in roles.items() if role is Role.DECODE))


def start_order(roles: Mapping[str, Role], depends_on: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Every server, each after its dependencies (explicit, then by role); ValueError on a cycle.

    Ties keep the order of `roles` (the order of the config file).
    """
    position = {name: i for i, name in enumerate(roles)}
    for name, deps in depends_on.items():
        unknown = [d for d in deps if d not in roles]
        if name not in roles or unknown:
            raise ValueError(f"depends_on names unknown servers: {[name, *unknown]}")

    def must_precede(a: str, b: str) -> bool:
        return a in depends_on.get(b, ()) or (roles[a], roles[b]) in _IMPLICIT

    done: list[str] = []
    pending = sorted(roles, key=lambda n: position[n])
    while pending:
        ready = [n for n in pending if not any(must_precede(m, n) for m in pending if m != n)]
        if not ready:
            raise ValueError(f"depends_on has a cycle among {pending}")
        done.append(ready[0])
        pending.remove(ready[0])
    return tuple(done)


def prefills_idle(prefills: Sequence[Observation | None], since: float) -> bool:
    """Every prefill serving and seen idle at some scrape after `since` (when the decode's queue froze).

    Idle: nothing running, queued, in flight over HTTP or in its bootstrap/inflight queue. A prefill that was
    idle after the freeze had finished with every request the decode was then waiting for, so a decode still
    waiting, without one decoded token, waits for KV that is not coming (failure-modes.md F3/F5). A prefill
    busy all along (a long prompt) may still send it.
    """
    if not prefills:
        return False
    for obs in prefills:
        if obs is None or not obs.ok:
            return False
        idle_at = progress_values(obs).get("idle_at")
        if idle_at is None or idle_at <= since:
            return False
    return True


BLAME_FRACTION = 0.25  # of the stall window: a prefill stalled this long explains a decode's wait for KV
STALE_FRACTION = 0.5  # of the stall window: a prefill's newest reading this old no longer vouches for it


def prefill_blamed(
    prefills: Sequence[Observation | None], stall_after_s: float, now: float, kv_awaited: bool = False
) -> str:
    """Why a decode's wait for KV is a prefill's fault ('' when no prefill explains it): a prefill not serving,
    its metrics unreadable or not read for half the stall window, or its own work stalled for a quarter of it
    (real-pd.md §4a: a stopped prefill scheduler parks the decode's request with `/health` 200 on the decode).
    A prefill whose work all waits for a decode's pre-allocation is stalled by the decode, not by itself — unless
    the decode already waits for KV (`kv_awaited`: it pre-allocated, so the prefill's bootstrap queue is a stale
    snapshot of a stopped scheduler, seen on the real pair when the stop caught a request being bootstrapped)."""
    for i, obs in enumerate(prefills):
        if obs is None:
            return f"prefill {i} is not serving"
        if not obs.ok:
            return f"prefill {i}'s metrics are unreadable"
        if now - obs.at >= stall_after_s * STALE_FRACTION:
            return f"prefill {i}'s metrics were last read {now - obs.at:.0f}s ago"
        stalled = float(progress_values(obs).get("stalled_s", 0.0))
        waits = waits_on_pair(Role.PREFILL, obs) and not kv_awaited
        if stalled >= stall_after_s * BLAME_FRACTION and not waits:
            return f"prefill {i} has had work in flight with no progress for {stalled:.0f}s"
    return ""


def waits_on_pair(role: str, progress: Observation) -> bool:
    """A PD worker none of whose own work runs: a decode whose requests all wait in its PD queues (for KV, or
    to pre-allocate it), a prefill whose requests all wait for a decode to pre-allocate (its bootstrap queue)."""
    v = progress_values(progress)
    queue, waiting = v.get("pd_queue") or 0.0, v.get("pd_waiting") or 0.0
    if v.get("running"):
        return False
    if role == Role.DECODE:
        return queue > 0
    return role == Role.PREFILL and waiting > 0 and queue <= waiting


def awaits_kv(progress: Observation) -> bool:
    """A decode with requests in its transfer queue: pre-allocated, waiting for a prefill's KV."""
    return float(progress_values(progress).get("pd_waiting") or 0.0) > 0


def prealloc_blocked(progress: Observation) -> bool:
    """A decode's stuck queue is all pre-allocation (none of it waits for a prefill's KV): the decode's own step —
    a request whose KV cannot fit its pool blocks every later one (real-pd.md §4b)."""
    v = progress_values(progress)
    return bool(v.get("pd_queue")) and v.get("pd_waiting") == 0


def transfer_wedge(
    progress: Observation,
    prefills: Sequence[Observation | None],
    stall_after_s: float,
    strong_fraction: float,
    now: float,
    logs: list[Any],
) -> Fault | None:
    """A decode's PD queue standing with no request's token (`policies.diagnose` rule 6): the prefill's fault while
    one is blamed; after `stall_after_s`, or `strong_fraction` of it when every prefill sat idle meanwhile."""
    v = progress_values(progress)
    pd_stalled = float(v.get("pd_stalled_s", 0.0))
    if pd_stalled and prefill_blamed(prefills, stall_after_s, now, awaits_kv(progress)):
        return None  # the prefill's own rules judge it; its requests fail here once it is gone
    idle = prefills_idle(prefills, since=progress.at - pd_stalled)
    if pd_stalled < stall_after_s * (strong_fraction if idle else 1.0):
        return None
    blocked = prealloc_blocked(progress)
    return make_fault(
        "pd_transfer_wedge",
        f"{'pre-allocation' if blocked else 'transfer'} queue stuck at {v.get('pd_queue')} for {pd_stalled:.0f}s, "
        "no decode progress" + (", every prefill idle" if idle else ""),
        0.9 if idle else 0.85,
        onset=progress.at - pd_stalled,
        progress={
            "pd_stalled_s": pd_stalled,
            **{k: v.get(k) for k in ("pd_queue", "pd_waiting", "pd_aborts")},
        },
        prefills_idle=idle,
        logs=logs,
        tags=["prealloc_blocked" if blocked else ""],
    )


def heartbeat_window_s(interval_s: float, max_failures: float) -> float:
    """How long a prefill's bootstrap endpoint must stay dark for a decode to drop it surely: one beat to start
    missing, then `max_failures` missed beats."""
    return max(0.0, interval_s) * (max(1.0, max_failures) + 1)


def relaunch_hold_s(released_at: float | None, window_s: float, now: float) -> float:
    """Seconds a prefill's relaunch still waits (0: launch now; a first launch never waits)."""
    if released_at is None:
        return 0.0
    return max(0.0, released_at + window_s - now)
