"""Gateway membership (pure): who belongs, the calls that get there, only this daemon's URLs, fleet safety."""

from __future__ import annotations

import pytest

from policies.membership import (
    TURN_SLOT_S,
    TURNS,
    Listed,
    Want,
    backoff_s,
    calls,
    may_stop,
    member_of,
    others_available,
    turn_s,
)
from supervisor.gateway.client import GatewayError
from supervisor.gateway.membership import Membership
from supervisor.reporting.metrics import SupervisorMetrics

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


class FakeGateway:
    """A gateway's `/workers` in memory; `refuse` lists URLs whose add fails with a 500."""

    def __init__(self, listed: list[Listed], refuse: tuple[str, ...] = ()) -> None:
        self.listed, self.refuse, self.calls, self.url = listed, refuse, [], "http://gw"

    async def workers(self) -> list[Listed]:
        return list(self.listed)

    async def add(self, url: str, worker_type: str = "regular", bootstrap_port: int | None = None) -> str:
        self.calls.append(("add", url))
        if url in self.refuse:
            raise GatewayError("status", f"POST /workers {url}: HTTP 500")
        self.listed.append(Listed(f"id-{len(self.calls)}", url, "ready"))
        return f"id-{len(self.calls)}"

    async def remove(self, worker_id: str) -> None:
        self.calls.append(("remove", worker_id))
        self.listed = [w for w in self.listed if w.id != worker_id]


async def test_a_round_removes_first_and_one_refused_add_holds_up_nothing_else() -> None:
    """The removal of a faulty server goes first; an add the gateway refuses is retried with backoff, and the
    other calls of the round are made anyway; the membership is shown per server with its last error."""
    fake = FakeGateway([Listed("old", B, "ready")], refuse=(A,))
    wants = [Want("a", A, True), Want("b", B, False), Want("c", OTHER, True)]
    membership = Membership(fake, lambda: wants, SupervisorMetrics())  # type: ignore[arg-type]
    await membership.round()
    assert fake.calls == [("remove", "old"), ("add", A), ("add", OTHER)]
    assert membership.failures == 1 and "HTTP 500" in (membership.view("a")["last_error"] or "")
    assert membership.view("c")["member"] and not membership.view("b")["member"]
    fake.refuse = ()
    await membership.round()
    assert membership.failures == 0 and membership.view("a")["member"]


def test_restarts_asked_at_once_check_min_available_in_turn() -> None:
    """Every daemon sees the same worker list: each worker of the model has its own turn, a slot apart (in the
    same instant all three would leave, each recheck would find none left, and the pool would be empty until
    they rejoined); a worker not listed yet takes its place among them; other models do not count."""
    listed = [
        Listed("1", "http://h2:30000", model="m"),
        Listed("2", "http://h1:30001/", model="m"),
        Listed("3", "http://h1:30000", model="m"),
        Listed("4", "http://h0:30000", model="other"),
    ]
    turns = [turn_s(u, "m", listed) for u in ("http://h1:30000", "http://h1:30001", "http://h2:30000")]
    assert turns == [0.0, TURN_SLOT_S, 2 * TURN_SLOT_S]
    assert turn_s("http://h1:29999", "m", listed) == 0.0
    many = [Listed(str(i), f"http://h{i:02d}:30000", model="m") for i in range(TURNS + 1)]
    assert turn_s(f"http://h{TURNS:02d}:30000", "m", many) == 0.0, "the turns repeat past TURNS workers"
