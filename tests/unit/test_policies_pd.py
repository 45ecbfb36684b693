"""PD ordering: which servers restart, and in which order, and the start order."""

from __future__ import annotations

import pytest

from policies.pd import Role, heartbeat_window_s, relaunch_hold_s, restart_order, start_order

ROLES = {"router": Role.ROUTER, "decode": Role.DECODE, "prefill": Role.PREFILL}


def test_decode_fault_restarts_decode_only() -> None:
    """A decode fault leaves a healthy prefill and the router alone."""
    assert restart_order("decode", ROLES) == ("decode",)


def test_prefill_restart_is_followed_by_every_decode() -> None:
    """A prefill restart is followed by a restart of each decode, which caches prefill endpoints."""
    roles = {**ROLES, "decode2": Role.DECODE}
    assert restart_order("prefill", roles) == ("prefill", "decode", "decode2")


def test_router_and_unified_restart_alone() -> None:
    """The router, and a unified server, restart only themselves."""
    assert restart_order("router", ROLES) == ("router",)
    assert restart_order("u", {"u": Role.UNIFIED}) == ("u",)


def test_unknown_server_raises() -> None:
    """Asking for a server not in the deployment is an error."""
    with pytest.raises(KeyError):
        restart_order("nope", ROLES)


def test_start_order_prefill_decode_router() -> None:
    """Prefills start before decodes, and routers after every worker."""
    assert start_order(ROLES, {}) == ("prefill", "decode", "router")


def test_start_order_honours_depends_on_and_file_order() -> None:
    """Explicit depends_on edges order unified servers; otherwise the file order is kept."""
    roles = {"a": Role.UNIFIED, "b": Role.UNIFIED, "c": Role.UNIFIED}
    assert start_order(roles, {}) == ("a", "b", "c")
    assert start_order(roles, {"a": ["c"]}) == ("b", "c", "a")


def test_start_order_rejects_cycles_and_unknown_names() -> None:
    """A dependency cycle, or a dependency on an unknown server, raises ValueError."""
    roles = {"a": Role.UNIFIED, "b": Role.UNIFIED}
    with pytest.raises(ValueError, match="cycle"):
        start_order(roles, {"a": ["b"], "b": ["a"]})
    with pytest.raises(ValueError, match="unknown"):
        start_order(roles, {"a": ["z"]})
    with pytest.raises(ValueError, match="cycle"):
        start_order(ROLES, {"prefill": ["decode"]})


def test_the_heartbeat_window_is_one_beat_to_start_missing_and_the_misses() -> None:
    """SGLang's defaults (5 s, 2 misses): a prefill dark for 15 s has surely been dropped by its decode."""
    assert heartbeat_window_s(5.0, 2) == 15.0
    assert heartbeat_window_s(5.0, 0) == 10.0 and heartbeat_window_s(-1.0, 2) == 0.0


def test_a_prefill_relaunch_waits_out_the_window_from_the_release() -> None:
    assert relaunch_hold_s(None, 15.0, 100.0) == 0.0  # a first launch never waits
    assert relaunch_hold_s(100.0, 15.0, 105.0) == 10.0
    assert relaunch_hold_s(100.0, 15.0, 130.0) == 0.0
