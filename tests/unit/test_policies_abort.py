"""policies.abort: the smallest action first — abort a blocked decode's requests, restart only if that failed."""

from __future__ import annotations

import pytest

from policies.abort import abort_first
from policies.model import Fault, make_fault

pytestmark = pytest.mark.unit


def blocked(restarted: bool = False, tags: tuple[str, ...] = ("prealloc_blocked",)) -> Fault:
    progress = {"pd_queue": 3.0, "pd_waiting": 0.0, "pd_stalled_s": 30.0, "pd_restarted": restarted}
    return make_fault(
        "pd_transfer_wedge", "pre-allocation queue stuck", 0.85, progress=progress, tags=list(tags)
    )


def test_a_blocked_pre_allocation_queue_is_aborted_first() -> None:
    plan = abort_first(blocked(), {"x": 1})
    assert plan is not None and plan.action == "abort" and dict(plan.levels) == {"x": 1} and not plan.page
    assert "abort_request" in plan.reason


def test_the_stand_an_abort_restarted_is_not_aborted_again() -> None:
    """The queue never got shorter after the abort: it freed nothing — restart instead."""
    assert abort_first(blocked(restarted=True), {}) is None


def test_a_transfer_wedge_is_never_aborted() -> None:
    """A request waiting for a prefill's KV: the decode restart or the prefill's own rules, not an abort."""
    assert abort_first(blocked(tags=()), {}) is None
