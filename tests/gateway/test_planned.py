"""Planned operations behind the real SMG: `rung set --restart`, a handover and a daemon stop lose no request; two
daemons (two hosts) restarting every server at once through one gateway never take the last ready worker out."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

from tests.gateway.support import Clients, GatewayDeployment, for_server, gateway_deployment
from tests.gateway.test_membership import FAST
from tests.support.daemon import checked
from tests.support.gateways import running_gateway
from tests.support.wait import wait_for


def test_rung_set_restart_a_handover_and_a_daemon_stop_lose_no_request(tmp_path: Path) -> None:
    """Clients through SMG throughout: `rung set --restart` on `a` (out, drained, relaunched, proven, back), a
    SIGUSR2 handover (same worker ids, nothing removed), then the daemon stopped (both out before their stop):
    not one request failed until the daemon stop took the last worker out."""
    with running_gateway("smg", tmp_path) as gw, gateway_deployment(tmp_path, gw, env=FAST) as dep:
        wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
        a = dep.named("a")
        with Clients(gw.url) as clients:
            clients.wait_ok(10)
            body = {"server": "a", "action": "set", "ladder": "decode_wedge", "level": 1, "restart": True}
            status, answer = dep.post("/control/rung", {**body, "reason": "planned"}, token=dep.token)
            assert status == 200, answer
            dep.wait_all(
                lambda s: s["a"]["state"] == "serving" and s["a"]["pid"] != a["pid"], 120, "a restarted"
            )
            ids = wait_for(lambda: dep.both_in(gw), 60, "a back in the gateway")
            clients.wait_ok(10)
            removed = len(dep.events("gateway.removed"))
            assert dep.daemon is not None
            os.kill(dep.daemon.pid, signal.SIGUSR2)
            wait_for(lambda: len(dep.events("daemon.started")) >= 2, 60, "the handed-over daemon started")
            dep.wait_all(
                lambda s: all(x["state"] == "serving" for x in s.values()), 60, "serving after handover"
            )
            clients.wait_ok(10)
            assert gw.live() == ids and len(dep.events("gateway.removed")) == removed
            assert clients.failed() == [], clients.failed()
        assert "--disable-overlap-schedule" in dep.named("a")["argv"]
        stop_at = len(dep.events("gateway.removed"))
        assert dep.stop_checked() == []
        assert {e["server"] for e in dep.events("gateway.removed")[stop_at:]} == {"a", "b"}
        assert all("out of the gateway" in e["result"] for e in dep.events("gateway.drained")[-2:])
        assert gw.live() == {}


def test_two_daemons_restarting_everything_at_once_keep_a_ready_worker(tmp_path: Path) -> None:
    """Host 1 (`a`, `b`) and host 2 (`c`) behind one SMG, `min_available = 1`: a restart of all three at once,
    under load, leaves at least one ready worker in the gateway at every moment; every restart is done (or
    refused with the count) and not one client request failed."""
    (tmp_path / "h1").mkdir()
    (tmp_path / "h2").mkdir()
    extra = {"min_available": 1, "wait_available_s": 90}
    with running_gateway("smg", tmp_path) as gw:
        one = GatewayDeployment(tmp_path / "h1", gateway_url=gw.url, gateway_extra=extra, env=FAST)
        two = GatewayDeployment(
            tmp_path / "h2", gateway_url=gw.url, gateway_extra=extra, env=FAST, names=("c",)
        )
        with checked(one), checked(two):
            one.start()
            two.start()
            wait_for(lambda: one.both_in(gw) and two.both_in(gw), 120, "three servers in the gateway")
            fewest = [3]
            watching = threading.Event()

            def watch() -> None:
                while not watching.is_set():
                    with contextlib.suppress(OSError, ValueError):
                        fewest[0] = min(fewest[0], len(gw.live()))
                    watching.wait(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            pids = {n: d.named(n)["pid"] for d, names in ((one, "ab"), (two, "c")) for n in names}
            with Clients(gw.url) as clients:
                clients.wait_ok(10)
                answers: dict[str, object] = {}

                def restart(dep: GatewayDeployment, name: str) -> None:
                    answers[name] = dep.post(
                        "/control/restart", {"server": name, "reason": "fleet"}, token=dep.token
                    )

                jobs = [
                    threading.Thread(target=restart, args=(d, n))
                    for d, n in ((one, "a"), (one, "b"), (two, "c"))
                ]
                for job in jobs:
                    job.start()
                for job in jobs:
                    job.join(timeout=240)
                done = lambda: all(  # noqa: E731
                    d.named(n)["pid"] != pids[n] and d.named(n)["state"] == "serving"
                    for d, names in ((one, "ab"), (two, "c"))
                    for n in names
                )
                wait_for(lambda: done() and len(gw.live()) == 3, 240, "all three restarted and back")
                clients.wait_ok(10)
            watching.set()
            watcher.join(timeout=5)
            assert fewest[0] >= 1, "the gateway was left with no ready worker"
            assert clients.failed() == [], clients.failed()
            refused = [e for d in (one, two) for e in d.events("gateway.restart_refused")]
            assert not refused, refused
            assert all(
                for_server(d.events("gateway.drained"), n)
                for d, names in ((one, "ab"), (two, "c"))
                for n in names
            )
