"""Decisions of the multi-node group protocol (docs/group-protocol.md); pure, `now` passed in.

A group is one SGLang server spread over `nnodes` hosts, one daemon per host. The group's state lives in
etcd: a **generation** record (bumped once per fault, carrying the incident, the reason, the group's
ladder levels and restart streak), one **member** record per node (attached to that daemon's lease) and
one **released** mark per node for the current generation (the barrier). This module decides; the
effects live in `supervisor/group/`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from policies.ladders import PastIncident
from policies.model import Fault
from policies.plan import Plan
from policies.triage import PlanFacts, plan

MAX_HISTORY = 32


class Phase(StrEnum):
    """Where one node stands in the protocol; published in its member record."""

    JOINING = "joining"  # connected, has not yet followed the current generation
    RELEASING = "releasing"  # stopping, reaping and verifying its GPUs free for the generation
    RELEASED = "released"  # waiting at the barrier of the generation
    RUNNING = "running"  # launched for the generation; `state` says how it is doing
    HALTED = "halted"  # the generation is `failed`: nothing runs until an operator acts


@dataclass(frozen=True, slots=True)
class Generation:
    """The group's current generation: why it began and how every node must launch it."""

    number: int
    incident: str = ""
    reason: str = ""
    by_rank: int = -1
    at: float = 0.0  # wall clock of the bump
    levels: Mapping[str, int] = field(default_factory=dict)  # the group's ladder levels
    restarts: tuple[float, ...] = ()  # wall-clock times of the group's restart streak
    history: tuple[tuple[str, int], ...] = ()  # (ladder key, rung) of the group's past incidents
    not_before: float = 0.0  # wall clock before which no node relaunches (the group's backoff)
    failed: bool = False  # restart budget spent or ladder exhausted: operator needed

    def to_json(self) -> str:
        """The record as stored in etcd."""
        data = asdict(self)
        data["levels"] = dict(self.levels)
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Generation:
        """Parse a stored record; raises ValueError on anything malformed."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("number"), int):
            raise ValueError("generation record without an integer 'number'")
        return Generation(
            number=raw["number"],
            incident=str(raw.get("incident", "")),
            reason=str(raw.get("reason", "")),
            by_rank=int(raw.get("by_rank", -1)),
            at=float(raw.get("at", 0.0)),
            levels={str(k): int(v) for k, v in dict(raw.get("levels") or {}).items()},
            restarts=tuple(float(t) for t in raw.get("restarts") or ()),
            history=tuple((str(k), int(r)) for k, r in raw.get("history") or ()),
            not_before=float(raw.get("not_before", 0.0)),
            failed=bool(raw.get("failed", False)),
        )


@dataclass(frozen=True, slots=True)
class Member:
    """One node as it publishes itself: rank, the generation it follows, its phase and server state."""

    rank: int
    generation: int
    phase: Phase
    state: str = ""
    host: str = ""
    updated: float = 0.0

    def to_json(self) -> str:
        """The record as stored in etcd."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Member:
        """Parse a stored record; raises ValueError on anything malformed."""
        raw: dict[str, Any] = json.loads(text)
        return Member(
            rank=int(raw["rank"]),
            generation=int(raw["generation"]),
            phase=Phase(raw["phase"]),
            state=str(raw.get("state", "")),
            host=str(raw.get("host", "")),
            updated=float(raw.get("updated", 0.0)),
        )


def first_generation(now: float) -> Generation:
    """The record the first daemon of a new group creates: every node launches generation 1 together."""
    return Generation(number=1, reason="group created", at=now)


def covers(current: Generation | None, fault_generation: int) -> bool:
    """True when the current generation is already later than the one the fault was seen in.

    A fault seen in generation G bumps only while the group is still at G: a second node seeing the same
    fault (or its consequence, ranks blocked in a collective) after the bump finds it covered.
    """
    return current is not None and current.number > fault_generation


def plan_group_restart(fault: Fault, facts: PlanFacts, current: Generation, now: float) -> Plan:
    """The recovery plan for a fault of the group: the server's own plan, with the group's restart streak,
    ladder history and levels in place of the node's (`now` is wall time: the group's records span hosts)."""
    group = replace(
        facts,
        restarts=current.restarts,
        serving_since=None,
        history=tuple(PastIncident(k, r) for k, r in current.history),
        levels=dict(current.levels),
    )
    return plan(fault, group, now).plan


def next_generation(
    current: Generation, plan: Plan, incident: str, reason: str, rank: int, now: float
) -> Generation:
    """The record that replaces `current` for a fault recovered by `plan` (relaunch, or fail)."""
    history = (*current.history, (plan.ladder_key or "", plan.rung))[-MAX_HISTORY:]
    return Generation(
        number=current.number + 1,
        incident=incident,
        reason=reason,
        by_rank=rank,
        at=now,
        levels=dict(plan.levels),
        restarts=(*current.restarts, now)[-MAX_HISTORY:],
        history=history,
        not_before=now + plan.delay_s,
        failed=plan.action == "fail",
    )


def member_loss_is_fault(last: Member | None, current: Generation | None) -> bool:
    """A member record vanished (its daemon's lease expired): a fault when it ran the current generation.

    A node that had released (or had not followed yet) is only waited for: the barrier needs it back.
    """
    return (
        last is not None
        and current is not None
        and last.generation == current.number
        and last.phase is Phase.RUNNING
    )


def barrier_missing(released_ranks: Sequence[int], nnodes: int) -> list[int]:
    """The ranks the barrier still waits for."""
    return sorted(set(range(nnodes)) - set(released_ranks))


def barrier_overdue(waiting_since: float, now: float, timeout_s: float) -> bool:
    """True when the barrier has waited longer than `timeout_s` (alert; never relaunch alone)."""
    return now - waiting_since > timeout_s


def relaunch_delay(current: Generation, now: float) -> float | None:
    """Seconds to wait before relaunching the generation (its backoff); None when it is `failed`."""
    if current.failed:
        return None
    return max(0.0, current.not_before - now)


def group_up(members: Mapping[int, Member], current: Generation, nnodes: int) -> bool:
    """True when every node runs the current generation and its server is up (serving or degraded)."""
    return all(
        (m := members.get(rank)) is not None
        and m.generation == current.number
        and m.phase is Phase.RUNNING
        and m.state in ("serving", "degraded")
        for rank in range(nnodes)
    )


class Step(StrEnum):
    """What a node's daemon must do next for the group."""

    HOLD = "hold"  # etcd unreachable or no generation known: keep watching locally, change nothing
    RUN = "run"  # our tree runs the current generation: supervise it
    RELEASE = "release"  # a newer generation: stop, reap, verify GPUs free, then mark released
    BARRIER = "barrier"  # released: wait for the other nodes
    LAUNCH = "launch"  # everyone released and the backoff has passed: launch the generation
    HALT = "halt"  # the generation is failed: nothing runs until an operator acts


@dataclass(frozen=True, slots=True)
class Order:
    """The step, the generation it is for, and why."""

    step: Step
    generation: int
    reason: str
    delay_s: float = 0.0


def decide(
    reachable: bool,
    current: Generation | None,
    local_generation: int,
    local_phase: Phase,
    released_ranks: Sequence[int],
    nnodes: int,
    now: float,
) -> Order:
    """The next step of one node, from the group's state as last read and the node's own."""
    if not reachable or current is None:
        why = "etcd unreachable: keep watching locally, no relaunch" if not reachable else "no generation yet"
        return Order(Step.HOLD, local_generation, why)
    g = current.number
    if local_generation == g and local_phase is Phase.RUNNING:
        return Order(Step.RUN, g, "running the current generation")
    if local_generation != g or local_phase not in (Phase.RELEASED, Phase.HALTED):
        return Order(Step.RELEASE, g, f"generation {g}: {current.reason or 'group restart'}")
    if current.failed:
        return Order(Step.HALT, g, f"generation {g} failed: {current.reason}; operator needed")
    missing = barrier_missing(released_ranks, nnodes)
    if missing:
        return Order(Step.BARRIER, g, f"waiting for nodes {missing} to release generation {g}")
    delay = relaunch_delay(current, now) or 0.0
    return Order(Step.LAUNCH, g, f"all {nnodes} nodes released generation {g}", delay)
