"""Server states, their legal transitions, and the fault vocabulary (DESIGN §4–§5).

The names are the names on the dashboard, in alerts and in `runbook.md`; see docs/contracts.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class ServerState(StrEnum):
    """Lifecycle state of one supervised server."""

    STOPPED = "stopped"  # not running and nothing planned
    STARTING = "starting"  # launched; ends when /health is 200 and the canary passes
    SERVING = "serving"  # healthy and proven by probes
    DEGRADED = "degraded"  # serving, but something a restart would not fix is wrong: alert, don't kill
    RECOVERING = "recovering"  # forensics → stop → reap → release GPUs → verify free
    BACKOFF = "backoff"  # waiting before the next start
    FAILED = "failed"  # budget spent or non-retryable fault: operator needed (slow retry may continue)
    PAUSED = "paused"  # maintenance: observe and report, never act
    STOPPING = "stopping"  # planned stop in progress (drain, then kill)

    @property
    def is_up(self) -> bool:
        """True while the server answers traffic (serving or degraded)."""
        return self in (ServerState.SERVING, ServerState.DEGRADED)


class FaultKind(StrEnum):
    """What went wrong; the label `fault` of metrics, alerts and incidents."""

    CRASH = "crash"
    STARTUP_FAILURE = "startup_failure"
    STARTUP_STALLED = "startup_stalled"
    DECODE_WEDGE = "decode_wedge"
    COLLECTIVE_HANG = "collective_hang"
    PD_TRANSFER_WEDGE = "pd_transfer_wedge"
    PARSER_MISCONFIG = "parser_misconfig"
    STREAM_LEAK = "stream_leak"
    OOM = "oom"
    GPU_FAULT = "gpu_fault"
    HEALTH_UNRESPONSIVE = "health_unresponsive"
    PAUSE_OVERRUN = "pause_overrun"
    REQUEST_STUCK = "request_stuck"
    BROWNOUT = "brownout"


_S = ServerState

# DESIGN §4: stopped → starting → serving ⇄ degraded; serving|degraded|starting → recovering → backoff
# → starting; any → failed; any → paused; stopping. A stop in progress completes before anything else
# (stopping → stopped | failed only), and paused resumes into whatever the probes then show.
TRANSITIONS: dict[ServerState, frozenset[ServerState]] = {
    _S.STOPPED: frozenset({_S.STARTING, _S.PAUSED, _S.FAILED}),
    _S.STARTING: frozenset({_S.SERVING, _S.RECOVERING, _S.FAILED, _S.PAUSED, _S.STOPPING}),
    _S.SERVING: frozenset({_S.DEGRADED, _S.RECOVERING, _S.FAILED, _S.PAUSED, _S.STOPPING}),
    _S.DEGRADED: frozenset({_S.SERVING, _S.RECOVERING, _S.FAILED, _S.PAUSED, _S.STOPPING}),
    _S.RECOVERING: frozenset({_S.BACKOFF, _S.FAILED, _S.PAUSED, _S.STOPPING}),
    _S.BACKOFF: frozenset({_S.STARTING, _S.FAILED, _S.PAUSED, _S.STOPPING}),
    _S.FAILED: frozenset({_S.STARTING, _S.PAUSED, _S.STOPPING}),
    _S.PAUSED: frozenset(
        {_S.STOPPED, _S.STARTING, _S.SERVING, _S.DEGRADED, _S.RECOVERING, _S.FAILED, _S.STOPPING}
    ),
    _S.STOPPING: frozenset({_S.STOPPED, _S.FAILED}),
}

# Least to most severe; the daemon's state is the most severe state of its servers.
SEVERITY: tuple[ServerState, ...] = (
    _S.SERVING,
    _S.DEGRADED,
    _S.PAUSED,
    _S.STOPPING,
    _S.STARTING,
    _S.STOPPED,
    _S.BACKOFF,
    _S.RECOVERING,
    _S.FAILED,
)


def check_transition(old: ServerState, new: ServerState) -> str | None:
    """None when `old → new` is legal, else the reason it is not (naming the allowed targets)."""
    allowed = TRANSITIONS[old]
    if new in allowed:
        return None
    targets = ", ".join(sorted(allowed))
    if new == old:
        return f"already {old}"
    return f"illegal transition {old} → {new}; from {old} allowed: {targets}"


def resume_target(before_pause: ServerState, running: bool, served_this_launch: bool) -> ServerState | None:
    """Where `resume` returns: the state before the pause for starting/degraded, else serving — or starting if
    this launch never served; None when nothing runs (the loop then launches)."""
    if not running:
        return None
    if before_pause in (_S.STARTING, _S.DEGRADED):
        return before_pause
    return _S.SERVING if served_this_launch else _S.STARTING


def worst(states: Iterable[ServerState]) -> ServerState:
    """The most severe of `states` by `SEVERITY`; raises ValueError when there are none."""
    ranked = [SEVERITY.index(s) for s in states]
    if not ranked:
        raise ValueError("worst() of no states")
    return SEVERITY[max(ranked)]
