"""Gateway membership (pure): who belongs, the calls that get there, only this daemon's URLs, fleet safety."""

from __future__ import annotations

import pytest

from policies.membership import Listed, Want, backoff_s, calls, may_stop, member_of, others_available

pytestmark = pytest.mark.unit
A, B, OTHER = "http://10.0.0.1:30000", "http://10.0.0.1:30010", "http://10.0.0.2:30000"


@pytest.mark.parametrize(
    ("role", "state", "proven", "paused", "adopted", "expected"),
    [
        ("unified", "serving", True, False, False, True),
        ("unified", "serving", False, False, False, False),  # serving unproven
        ("unified", "serving", True, True, False, False),  # engine paused by its RL client
        ("unified", "degraded", True, False, False, False),
        ("unified", "recovering", True, False, False, False),  # a fault decided: out before the kill
        ("unified", "stopping", True, False, False, False),
        ("unified", "starting", True, False, False, False),  # a relaunch not yet proven
        ("unified", "starting", True, False, True, None),  # adopted, not yet judged: left as it is
        ("unified", "stopped", True, False, False, None),  # a daemon starting has judged nothing
        ("router", "serving", True, False, False, None),  # never a worker
        ("decode", "serving", True, False, False, True),
    ],
)
def test_who_belongs(
    role: str, state: str, proven: bool, paused: bool, adopted: bool, expected: object
) -> None:
    """A server is a member exactly while proven; unknowns are left as the gateway has them."""
    assert member_of(role, state, proven, paused, adopted) is expected


def test_calls_touch_only_this_daemons_urls_and_skip_what_already_holds() -> None:
    """Add the missing proven one, remove the failed one (every live copy), leave other hosts' and draining ones."""
    wants = [
        Want("a", A, True),
        Want("b", B, False, "prefill", 8998),
        Want("c", "http://10.0.0.1:30020", None),
    ]
    listed = [
        Listed("1", B + "/", "ready"),
        Listed("2", B, "ready"),
        Listed("3", OTHER, "ready"),
        Listed("4", A, "draining"),
        Listed("5", "http://10.0.0.1:30020", "ready"),
    ]
    got = calls(wants, listed)
    assert [(c.op, c.server, c.id) for c in got] == [
        ("add", "a", ""),
        ("remove", "b", "1"),
        ("remove", "b", "2"),
    ]
    assert calls([Want("a", A, True)], [Listed("9", A, "")]) == []


def test_a_planned_stop_leaves_min_available_other_ready_workers() -> None:
    """Only other hosts' healthy, ready workers of the same model count; draining and unhealthy do not."""
    listed = [
        Listed("1", A, "ready", True, "m"),
        Listed("2", OTHER, "ready", True, "m"),
        Listed("3", "http://10.0.0.3:1", "", True, "m"),
        Listed("4", "http://10.0.0.4:1", "draining", True, "m"),
        Listed("5", "http://10.0.0.5:1", "ready", False, "m"),
        Listed("6", "http://10.0.0.6:1", "ready", True, "other-model"),
    ]
    available = others_available("m", [A, B], listed)
    assert available == 2
    assert may_stop(available, 2)[0] and not may_stop(available, 3)[0]
    assert "only 2 other ready worker(s)" in may_stop(available, 3)[1]


def test_backoff_doubles_to_its_cap() -> None:
    assert [backoff_s(n) for n in (0, 1, 2, 3, 10)] == [0.0, 1.0, 2.0, 4.0, 30.0]
