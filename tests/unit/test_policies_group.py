"""The group protocol's pure decisions: coverage of faults, next generation, member loss, the node's next step."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policies.group import (
    Generation,
    Member,
    Phase,
    Step,
    covers,
    decide,
    first_generation,
    group_up,
    member_loss_is_fault,
    next_generation,
    plan_group_restart,
)
from policies.ladders import DEFAULT_LADDERS
from policies.model import Fault
from policies.plan import Plan
from policies.triage import PlanFacts


@dataclass(frozen=True)
class Restart:
    restarts: int = 2
    window_s: float = 600
    initial_s: float = 5
    factor: float = 2
    max_s: float = 300
    jitter: float = 0
    stable_after_s: float = 600
    slow_retry_s: float = 0


G3 = Generation(3, incident="i3", reason="crash")


def test_a_fault_seen_in_an_older_generation_is_covered() -> None:
    """A fault from generation 2 is covered once the group is at 3; one from 3 is not."""
    assert covers(G3, 2)
    assert not covers(G3, 3)
    assert not covers(None, 0)


def test_next_generation_carries_incident_levels_streak_and_backoff() -> None:
    """The bump records who, why, the plan's levels, the restart time and the backoff deadline."""
    plan = Plan("relaunch", "r", "collective_hang", 1, {"collective_hang": 1}, delay_s=5)
    new = next_generation(G3, plan, "i4", "rank 9 died", rank=1, now=100.0)
    assert (new.number, new.incident, new.reason, new.by_rank) == (4, "i4", "rank 9 died", 1)
    assert new.levels == {"collective_hang": 1} and new.restarts == (100.0,) and new.not_before == 105.0
    assert new.history == (("collective_hang", 1),) and not new.failed
    assert Generation.from_json(new.to_json()) == new


def test_the_group_budget_spent_makes_a_failed_generation() -> None:
    """With the group's streak full, the plan fails and the new generation is marked failed."""
    current = Generation(5, restarts=(90.0, 95.0))
    facts = PlanFacts("unified", (), (), 50.0, Restart(), 0.5, (), {}, DEFAULT_LADDERS, "fix")
    plan = plan_group_restart(Fault("crash", {}, 0.95, "rank lost", 99.0), facts, current, now=100.0)
    assert plan.action == "fail"
    assert next_generation(current, plan, "i", "r", 0, 100.0).failed


def test_losing_a_running_member_of_the_current_generation_is_a_fault() -> None:
    """A vanished member that ran the current generation is a fault; one that had released is awaited."""
    assert member_loss_is_fault(Member(1, 3, Phase.RUNNING, "serving"), G3)
    assert not member_loss_is_fault(Member(1, 3, Phase.RELEASED), G3)
    assert not member_loss_is_fault(Member(1, 2, Phase.RUNNING), G3)
    assert not member_loss_is_fault(None, G3)


@pytest.mark.parametrize(
    ("reachable", "local", "phase", "released", "current", "step"),
    [
        (False, 3, Phase.RUNNING, [], G3, Step.HOLD),
        (True, 3, Phase.RUNNING, [], G3, Step.RUN),
        (True, 2, Phase.RUNNING, [], G3, Step.RELEASE),
        (True, 3, Phase.JOINING, [], G3, Step.RELEASE),
        (True, 3, Phase.RELEASED, [0], G3, Step.BARRIER),
        (True, 3, Phase.RELEASED, [0, 1], G3, Step.LAUNCH),
        (True, 3, Phase.RELEASED, [0, 1], Generation(3, failed=True), Step.HALT),
        (True, 0, Phase.JOINING, [], None, Step.HOLD),
    ],
)
def test_decide_the_next_step(
    reachable: bool, local: int, phase: Phase, released: list[int], current: Generation | None, step: Step
) -> None:
    """The node's next step follows from reachability, the generation and the barrier."""
    assert decide(reachable, current, local, phase, released, 2, now=0.0).step is step


def test_launch_waits_for_the_group_backoff() -> None:
    """A generation with a backoff deadline launches after the remaining delay."""
    order = decide(True, Generation(2, not_before=110.0), 2, Phase.RELEASED, [0, 1], 2, now=100.0)
    assert order.step is Step.LAUNCH and order.delay_s == 10.0


def test_the_group_is_up_only_when_every_node_serves_the_current_generation() -> None:
    """Node 0 may call the group up only when all nodes run the current generation and are up."""
    up = {0: Member(0, 3, Phase.RUNNING, "serving"), 1: Member(1, 3, Phase.RUNNING, "degraded")}
    assert group_up(up, G3, 2)
    assert not group_up({0: up[0]}, G3, 2)
    assert not group_up({**up, 1: Member(1, 3, Phase.RUNNING, "starting")}, G3, 2)
    assert first_generation(1.0).number == 1
