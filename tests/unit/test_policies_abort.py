"""policies.abort: the smallest action first — abort a blocked decode's requests, restart only if that failed."""

from __future__ import annotations

import pytest

from policies.abort import MAX_ABORTS, abort_first
from policies.model import Fault, make_fault

pytestmark = pytest.mark.unit


def blocked(aborts: int = 0, tags: tuple[str, ...] = ("prealloc_blocked",)) -> Fault:
    progress = {"pd_queue": 3.0, "pd_waiting": 0.0, "pd_stalled_s": 30.0, "pd_aborts": aborts}
    return make_fault(
        "pd_transfer_wedge", "pre-allocation queue stuck", 0.85, progress=progress, tags=list(tags)
    )


def test_a_blocked_pre_allocation_queue_is_aborted_first() -> None:
    plan = abort_first(blocked(), {"x": 1})
    assert plan is not None and plan.action == "abort" and dict(plan.levels) == {"x": 1} and not plan.page
    assert "abort_request" in plan.reason


def test_a_stand_aborts_did_not_free_is_aborted_again_then_restarted() -> None:
    """SMG resends an aborted request (five tries by default): the long prompt blocks the queue again within a
    scrape, so a stand an abort did not visibly free is aborted again — up to MAX_ABORTS in a row, then restarted."""
    again = abort_first(blocked(aborts=MAX_ABORTS - 1), {})
    assert again is not None and again.action == "abort"
    assert abort_first(blocked(aborts=MAX_ABORTS), {}) is None


def test_a_transfer_wedge_is_never_aborted() -> None:
    """A request waiting for a prefill's KV: the decode restart or the prefill's own rules, not an abort."""
    assert abort_first(blocked(tags=()), {}) is None
