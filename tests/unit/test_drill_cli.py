"""`sglang-supervisor drill` refuses what is not a drill, saying what to run instead."""

from __future__ import annotations

import io

from supervisor.training.drill import run_drill
from supervisor.training.scenarios import DRILLS


def test_unknown_scenario_exits_2_listing_the_drills() -> None:
    """An unknown scenario exits 2 with a message naming every valid drill."""
    out = io.StringIO()
    assert run_drill("no_such_fault", out=out) == 2
    text = out.getvalue()
    assert "'no_such_fault' is not a drill: unknown scenario" in text
    assert all(name in text for name in DRILLS)


def test_launch_time_scenario_points_to_the_demo() -> None:
    """A catalog fault that only fires at launch is not a drill: exit 2 and the demo command to use instead."""
    out = io.StringIO()
    assert run_drill("slow_startup_deepgemm", out=out) == 2
    assert "sglang-supervisor demo --scenario slow_startup_deepgemm" in out.getvalue()
