"""policies.abort: the smallest action first — abort a blocked decode's requests, restart only if that failed."""

from __future__ import annotations

import pytest

from policies.abort import abort_first
from policies.model import Fault, make_fault

pytestmark = pytest.mark.unit


def blocked(onset: float, tags: tuple[str, ...] = ("prealloc_blocked",)) -> Fault:
    return make_fault("pd_transfer_wedge", "pre-allocation queue stuck", 0.85, onset=onset, tags=list(tags))


def test_a_blocked_pre_allocation_queue_is_aborted_first() -> None:
    plan = abort_first(blocked(100.0), None, {"x": 1})
    assert plan is not None and plan.action == "abort" and dict(plan.levels) == {"x": 1} and not plan.page
    assert "abort_request" in plan.reason


def test_the_stand_an_abort_restarted_is_not_aborted_again() -> None:
    """The abort restarted the stand's clock: the same stand a window later did not drain — restart instead."""
    assert abort_first(blocked(200.0), 200.0, {}) is None


def test_a_new_stand_after_the_queue_drained_is_aborted_again() -> None:
    """A client sent the oversized prompt again: a new stand, begun well after the last abort."""
    plan = abort_first(blocked(260.0), 200.0, {})
    assert plan is not None and plan.action == "abort"


def test_a_transfer_wedge_is_never_aborted() -> None:
    """A request waiting for a prefill's KV: the decode restart or the prefill's own rules, not an abort."""
    assert abort_first(blocked(100.0, ()), None, {}) is None
