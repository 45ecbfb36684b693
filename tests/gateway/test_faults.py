"""Each unplanned fault through the real SMG: the faulty server leaves the gateway at the moment the fault is
decided (before its kill), nothing sent after that fails, and its relaunch rejoins only once proven; a server whose
canary never passes is never added."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.gateway.support import Clients, Dispatches, for_server, gateway_deployment, ts
from tests.gateway.test_membership import FAST
from tests.support.gateways import running_gateway
from tests.support.http import http
from tests.support.wait import wait_for

# a relaunch that loads for 8 s: longer than SMG keeps a removed URL `draining` (5 s), so an add made before
# the relaunch is proven would reach the gateway, not a 409
SLOW_LOAD = {**FAST, "SGLANG_SIM_STARTUP_S": "8"}

# fault → (server a's tp, how it is caused, the fault kinds the supervisor may name)
FAULTS: dict[str, tuple[int, str, tuple[str, ...]]] = {
    "main_killed": (1, "kill-main", ("crash",)),
    "rank_killed": (1, "kill", ("crash",)),
    "tp_desync_hang": (2, "overlap_tp_desync_hang", ("collective_hang",)),
    "silent_wedge": (2, "watchdog_disabled_silent_wedge", ("collective_hang", "decode_wedge")),
}


def cause(dep: Any, how: str, pid: int) -> None:
    if how == "kill-main":
        os.kill(pid, signal.SIGKILL)
        return
    if how == "kill":
        rank = next(
            p
            for p in psutil.Process(pid).children(recursive=True)
            if "sglang::scheduler" in " ".join(p.cmdline())
        )
        os.kill(rank.pid, signal.SIGKILL)
        return
    answer = http(dep.url_of("a") + "/sim/fault", "POST", {"name": how, "after_requests": 1})
    assert answer.status == 200, answer.body


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_unplanned_fault_takes_the_server_out_before_its_kill(tmp_path: Path, fault: str) -> None:
    """Under load through SMG: out of rotation at detection, before the kill; no request sent after the removal
    fails; the relaunch is added only once serving (canary passed) under a new worker id."""
    tp, how, kinds = FAULTS[fault]
    with (
        running_gateway("smg", tmp_path) as gw,
        gateway_deployment(tmp_path, gw, env=SLOW_LOAD, a_tp=tp) as dep,
    ):
        first = wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
        a = dep.named("a")
        dispatches = Dispatches(gw)
        with Clients(gw.url, rate=8.0) as clients:
            clients.wait_ok(10)
            cause(dep, how, a["pid"])
            again = dep.wait_all(
                lambda s: s["a"]["state"] == "serving" and s["a"]["pid"] != a["pid"], 150, "a relaunched"
            )
            wait_for(lambda: dep.both_in(gw), 60, "a back in the gateway")
            clients.wait_ok(10)
        dispatches.close()
        incident = again["a"]["last_incident"]
        assert incident["fault"] in kinds, incident
        removed = for_server(dep.events("gateway.removed"), "a")
        released = for_server(dep.events("recovery.release"), "a")
        added = for_server(dep.events("gateway.added"), "a")
        assert removed and ts(removed[0]) < ts(released[0]), "out of rotation before the kill"
        relaunch_adds = [e for e in added if ts(e) > ts(released[0])]
        assert relaunch_adds and all(ts(e) >= again["a"]["since"] for e in relaunch_adds), "added once proven"
        assert relaunch_adds[-1]["worker_id"] != first[dep.url_of("a")]
        assert [r for r in clients.failed() if r[0] > ts(removed[0])] == [], clients.failed()
        # SMG's own per-worker count (sampled every 0.1 s): nothing sent to `a` from its removal to its
        # relaunch's proof (the wedged tree, its dead port, the unproven relaunch)
        assert dispatches.between(dep.url_of("a"), ts(removed[0]) + 0.3, again["a"]["since"]) == []


def test_a_server_whose_canary_never_passes_is_never_added(tmp_path: Path) -> None:
    """`a` launched without its tool-call parser and `parser_policy = "alert"`: degraded from its first canary,
    never a worker of the gateway, while `b` serves every client request."""
    a_args = ["--reasoning-parser", "qwen3"]
    with (
        running_gateway("smg", tmp_path) as gw,
        gateway_deployment(tmp_path, gw, env=FAST, a_args=a_args, policy={"parser_policy": "alert"}) as dep,
    ):
        dep.wait_all(
            lambda s: s["a"]["state"] == "degraded" and s["b"]["state"] == "serving", 120, "a degraded"
        )
        wait_for(lambda: dep.url_of("b") in gw.live(), 30, "b in the gateway")
        with Clients(gw.url, n=2, max_requests=20) as clients:
            clients.wait_ok(10)
        assert dep.url_of("a") not in gw.live() and dep.events("gateway.added") and clients.failed() == []
        assert {e["server"] for e in dep.events("gateway.added")} == {"b"}


def test_a_server_that_leaks_under_concurrent_streaming_is_out_while_degraded(tmp_path: Path) -> None:
    """Markup leaking only under concurrent streams (alert-only, the server stays up): `degraded` takes `a` out
    of the gateway with no restart, `b` serves every client meanwhile."""
    probes = {"stream_canary_first_s": 15, "stream_canary_period_s": 600}  # armed before it runs
    with (
        running_gateway("smg", tmp_path) as gw,
        gateway_deployment(tmp_path, gw, env=FAST, probes=probes) as dep,
    ):
        wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
        a = dep.named("a")
        leak = {"name": "tool_markup_leak_under_load", "concurrency_ge": 8}
        assert http(dep.url_of("a") + "/sim/fault", "POST", leak).status == 200
        with Clients(gw.url, n=2, max_requests=200) as clients:
            degraded = dep.wait_all(
                lambda s: s["a"]["state"] == "degraded", 120, "a degraded by the load canary"
            )
            wait_for(lambda: dep.url_of("a") not in gw.live(), 30, "a out of the gateway")
            clients.wait_ok(10)
        assert degraded["a"]["pid"] == a["pid"] and degraded["a"]["last_incident"]["fault"] == "stream_leak"
        assert clients.failed() == [], clients.failed()
