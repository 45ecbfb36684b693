"""Frozen ranks as evidence: a rank stopped (`T`) or in uninterruptible sleep (`D`) with no CPU time runs nothing
until someone resumes it (a SIGSTOP, a rank stuck in the driver). A busy server, however slow or starved of CPU,
has its ranks running or sleeping (`R`/`S`), so a frozen rank is never load.

- A `/health` that failed while a rank stayed frozen through its whole wait, nothing in flight: the idle engine is
  frozen, decided at that first failure (`health_unresponsive`, tag `ranks_frozen`) instead of after
  `unresponsive_after_s`.
- A rank blocked in a collective while a peer is frozen waits for a peer that never comes (`collective_hang`);
  the stack of a frozen rank is where it stopped, not where it waits, so it never votes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from policies.model import Fault, Observation, health_values, progress_values, ranks_values
from policies.window import Window

FROZEN_COVER_S = (
    2.0  # the ranks probe reads every second: a freeze seen this soon after a /health began covers it
)


def frozen_through(w: Window, health: Observation) -> tuple[list[str], list[Observation]]:
    """The ranks frozen in every `ranks` reading over the wait of one /health (at least two readings, the first
    within `FROZEN_COVER_S` of its start), and those readings."""
    start = health.at - (health.latency_s or 0.0)
    span = [o for o in w.all("ranks") if start <= o.at <= health.at]
    if len(span) < 2 or span[0].at - start > FROZEN_COVER_S:
        return [], span
    frozen = set(ranks_values(span[0]).get("frozen", ()))
    for obs in span[1:]:
        frozen &= set(ranks_values(obs).get("frozen", ()))
    return sorted(frozen), span


def frozen_unresponsive(w: Window, failing: Sequence[Observation]) -> Fault | None:
    """`health_unresponsive` when the newest of the failing /health probes (newest first) waited on frozen ranks
    and nothing is in flight (with work in flight, the stall rules name the fault: a wedge, a collective hang)."""
    progress = w.latest("progress")
    if not failing or (progress is not None and progress_values(progress).get("work")):
        return None
    health = failing[0]
    frozen, span = frozen_through(w, health)
    if not frozen:
        return None
    newest = ranks_values(span[-1])
    states = dict(newest.get("states", {}))
    status = health_values(health).get("status") or "timed out"
    evidence: dict[str, Any] = {
        "health": {"statuses": [health_values(o).get("status") for o in reversed(failing)][-10:]},
        "ranks": {
            "frozen": frozen,
            "states": states,
            "cpu_s": dict(newest.get("cpu_s", {})),
            "readings": len(span),
        },
        "last_progress_at": w.last_progress_at(),
        "tags": ["ranks_frozen"],
    }
    reason = (
        f"/health {status} after {health.latency_s or 0:.0f}s with ranks frozen throughout: "
        + ", ".join(f"{t} ({states.get(t)})" for t in frozen)
    )
    return Fault("health_unresponsive", evidence, 0.9, reason, health.at - (health.latency_s or 0.0))


def schedulers_of(frames: Mapping[str, Any]) -> set[str]:
    """The scheduler ranks of a stacks reading (every rank when none is titled as one)."""
    return {t for t in frames if "scheduler" in t} or set(frames)


def waiting_on_frozen(
    frames: Mapping[str, Mapping[str, Any]], ranks: Observation | None, not_blocking: Collection[str]
) -> tuple[dict[str, str], list[str]]:
    """(live scheduler → the blocking collective it waits in, the frozen schedulers) for one stacks reading."""
    schedulers = schedulers_of(frames)
    frozen = set(ranks_values(ranks).get("frozen", ())) & schedulers if ranks else set()
    if not frozen:
        return {}, []
    blocked = {
        t: str(frames[t]["collective"])
        for t in schedulers - frozen
        if frames[t].get("collective") and frames[t]["collective"] not in not_blocking
    }
    return blocked, sorted(frozen)
