"""The supervisor owns its servers' membership in the real SGLang gateway (SMG 1.13.0, sglang-router 0.3.2):
a server joins once proven, leaves at the moment a fault is decided (before the kill), returns only once its
relaunch is proven; a planned restart loses no request; a daemon's own restart changes nothing there; a gateway
that restarts empty is refilled, and one that is down never holds up a recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from supervisor.config import ConfigError, load_config
from tests.gateway.support import NAMES, Clients, GatewayDeployment, for_server, gateway_deployment, ts
from tests.support.gateways import KINDS, Gateway, running_gateway
from tests.support.http import http
from tests.support.wait import wait_for

FAST = {"SGLANG_SIM_STEP_S": "0.02"}


def schedulers(main_pid: int) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(main_pid).children(recursive=True)
        if "sglang::scheduler" in " ".join(p.cmdline())
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_wedged_server_leaves_at_detection_and_returns_only_once_its_relaunch_is_proven(
    tmp_path: Path, kind: str
) -> None:
    """Both servers join once proven; `a`'s scheduler stopped under load through the gateway: `a` is removed
    before its tree is killed, nothing more reaches it, the relaunch is added after its canary passed; the only
    failed requests are those already on `a` when it wedged."""
    with running_gateway(kind, tmp_path) as gw, gateway_deployment(tmp_path, gw, env=FAST) as dep:
        first = wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
        a = dep.named("a")
        with Clients(gw.url) as clients:
            clients.wait_ok(20)
            for proc in schedulers(a["pid"]):
                os.kill(proc.pid, signal.SIGSTOP)
            again = dep.wait_all(
                lambda s: s["a"]["state"] == "serving" and s["a"]["pid"] != a["pid"], 120, "a relaunched"
            )
            back = wait_for(lambda: dep.both_in(gw), 60, "a back in the gateway")
            clients.wait_ok(20)
        incident = again["a"]["last_incident"]
        assert incident["fault"] in ("collective_hang", "decode_wedge", "health_unresponsive"), incident
        removed = for_server(dep.events("gateway.removed"), "a")
        released = for_server(dep.events("recovery.release"), "a")
        added = for_server(dep.events("gateway.added"), "a")
        assert removed and released and ts(removed[0]) < ts(released[0]), "out of rotation before the kill"
        assert ts(removed[0]) - incident["detected_at"] < 1.0, (ts(removed[0]), incident["detected_at"])
        assert (
            added[-1]["worker_id"] != first[dep.url_of("a")]
            and back[dep.url_of("a")] == added[-1]["worker_id"]
        )
        serving_at = again["a"]["since"]
        relaunch_adds = [e for e in added if ts(e) > ts(released[0])]
        assert all(ts(e) >= serving_at for e in relaunch_adds), "added only once the relaunch's canary passed"
        late = [r for r in clients.failed() if r[0] > ts(removed[0])]
        assert late == [], f"requests sent after the removal failed: {late}"
        assert len(clients.failed()) <= clients.n, clients.failed()


@pytest.mark.parametrize("kind", KINDS)
def test_an_operator_restart_through_the_gateway_loses_no_request(tmp_path: Path, kind: str) -> None:
    """`restart --server a` with clients (streaming and not) through the gateway: `a` leaves, its requests end,
    it restarts, is proven, rejoins; not one client request failed."""
    with running_gateway(kind, tmp_path) as gw, gateway_deployment(tmp_path, gw, env=FAST) as dep:
        wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
        a = dep.named("a")
        with Clients(gw.url) as clients:
            clients.wait_ok(20)
            status, _ = dep.post("/control/restart", {"server": "a", "reason": "planned"}, token=dep.token)
            assert status == 200
            dep.wait_all(
                lambda s: s["a"]["state"] == "serving" and s["a"]["pid"] != a["pid"], 120, "a restarted"
            )
            wait_for(lambda: dep.both_in(gw), 60, "a back in the gateway")
            clients.wait_ok(20)
        assert clients.failed() == [], clients.failed()
        drained = for_server(dep.events("gateway.drained"), "a")
        assert drained and "out of the gateway" in drained[0]["result"], drained


def test_a_daemon_killed_and_its_successor_adopting_changes_nothing_in_the_gateway(tmp_path: Path) -> None:
    """SIGKILL of the daemon under load: the servers keep serving, the next daemon adopts them, and the gateway
    keeps the same worker ids throughout; not one request failed."""
    with running_gateway("smg", tmp_path) as gw, gateway_deployment(tmp_path, gw, env=FAST) as dep:
        ids = wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
        pids = {n: dep.named(n)["pid"] for n in NAMES}
        with Clients(gw.url) as clients:
            clients.wait_ok(10)
            assert dep.daemon is not None
            os.killpg(dep.daemon.pid, signal.SIGKILL)
            dep.daemon.wait(timeout=10)
            dep.start()
            adopted = dep.wait_all(
                lambda s: all(s[n]["state"] == "serving" and s[n]["adopted"] for n in NAMES), 60, "adopted"
            )
            clients.wait_ok(10)
            assert gw.live() == ids
        assert {n: adopted[n]["pid"] for n in NAMES} == pids
        assert clients.failed() == [], clients.failed()
        assert dep.events("gateway.removed") == []


def test_a_gateway_down_never_holds_up_a_recovery_and_an_empty_one_is_refilled(tmp_path: Path) -> None:
    """The gateway stopped, then `a`'s scheduler killed: `a` is relaunched and serving while the gateway is down
    (its last error in /status); a new, empty gateway on the same port gets both servers back."""
    gw = Gateway("smg", tmp_path / "smg-1.log").start()
    try:
        with gateway_deployment(tmp_path, gw, env=FAST) as dep:
            wait_for(lambda: dep.both_in(gw), 120, "both servers serving and in the gateway")
            gw.stop()
            a = dep.named("a")
            schedulers(a["pid"])[0].kill()
            down = dep.wait_all(
                lambda s: s["a"]["state"] == "serving" and s["a"]["pid"] != a["pid"], 120, "a relaunched"
            )
            assert down["a"]["gateway"]["last_error"], down["a"]["gateway"]
            assert dep.status()["gateway"]["reachable"] is False
            # the series SglangGatewayMembershipStale reads: a proven `a` not in the gateway, for ever longer
            stale = 'sglang_supervisor_gateway_out_of_sync_seconds{server="a"}'
            wait_for(lambda: metric(dep, stale) >= 2.0, 30, "a out of sync while the gateway is down")
            fresh = Gateway("smg", tmp_path / "smg-2.log", port=gw.port, prometheus_port=gw.prometheus_port)
            gw = fresh.start()
            wait_for(lambda: dep.both_in(gw), 90, "both servers back in the new gateway")
            assert dep.status()["gateway"]["reachable"] is True
    finally:
        gw.stop()


def test_check_config_refuses_a_loopback_worker_behind_a_remote_gateway(tmp_path: Path) -> None:
    """A gateway on another host cannot reach 127.0.0.1: `advertise_url` is required, named by its field."""
    dep = GatewayDeployment(tmp_path, gateway_url="http://10.0.0.5:30000")
    with pytest.raises(ConfigError) as info:
        load_config(dep.config_path, env={})
    assert "servers[0].advertise_url" in info.value.format_errors()


def test_check_config_says_when_the_gateway_refuses_the_key_or_is_not_a_gateway(tmp_path: Path) -> None:
    """check-config asks the gateway once: a wrong admin key (401), a URL that is no gateway; still exit 0."""
    for sub in ("k", "n"):
        (tmp_path / sub).mkdir()
    with running_gateway("smg", tmp_path) as gw:
        dep = GatewayDeployment(tmp_path / "k", gateway_url=gw.url)
        (dep.root / "gateway-key").write_text("not-the-key\n")
        wrong = check_config(dep.config_path)
        assert wrong.returncode == 0 and "HTTP 401" in wrong.stderr and "admin_key_file" in wrong.stderr
        other = GatewayDeployment(tmp_path / "n", gateway_url=f"http://127.0.0.1:{gw.prometheus_port}")
        notgw = check_config(other.config_path)
        assert notgw.returncode == 0 and "not a gateway's worker list" in notgw.stderr, notgw.stderr


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "supervisor.cli", "check-config", "--config", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def metric(dep: GatewayDeployment, series: str) -> float:
    """One series of the daemon's /metrics (0 when absent)."""
    for line in http(dep.url + "/metrics").body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
