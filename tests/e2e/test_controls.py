"""Operator controls: bearer token, pause means observe and never act, resume lets recovery proceed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil

from tests.support.daemon import deployment
from tests.support.wait import wait_for


def serving(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving"


def test_control_needs_the_right_token_and_pause_blocks_recovery_until_resume(tmp_path: Path) -> None:
    """401 without or with a wrong token; paused: a crash is reported, not acted on; resume: recovery runs."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        assert dep.post("/control/pause", {})[0] == 401
        assert dep.post("/control/pause", {}, token="wrong")[0] == 401
        status, body = dep.post("/control/pause", {"server": "sim", "reason": "maintenance"}, token=dep.token)
        assert status == 200 and body["servers"]["sim"] == "pause"
        dep.wait(lambda s: s["state"] == "paused", what="paused")
        main = psutil.Process(first["pid"])
        rank = next(c for c in main.children(recursive=True) if "scheduler_TP0" in " ".join(c.cmdline()))
        rank.kill()
        observed = dep.wait(
            lambda s: (s["last_incident"] or {}).get("action") == "observed (paused)", what="observed"
        )
        assert observed["state"] == "paused" and observed["restarts"] == 0
        assert observed["pid"] == first["pid"], "paused: no relaunch"
        journal = (tmp_path / "state" / "incidents.jsonl").read_text()
        assert '"actor"' in journal and "maintenance" in journal
        assert dep.post("/control/resume", {"server": "sim", "reason": "done"}, token=dep.token)[0] == 200
        again = dep.wait(
            lambda s: serving(s) and s["pid"] != first["pid"], timeout=90, what="recovered after resume"
        )
        assert again["restarts"] == 1


def test_control_is_forbidden_without_a_configured_token(tmp_path: Path) -> None:
    """No token file configured: control endpoints answer 403 and say how to enable them."""
    with deployment(tmp_path) as dep:
        text = dep.config_path.read_text().replace(f'token_file = "{tmp_path / "token"}"\n', "")
        dep.config_path.write_text(text)
        dep.start()
        dep.wait(lambda s: s["state"] in ("starting", "serving"), what="up")
        status, body = dep.post("/control/restart", {}, token=dep.token)
        assert status == 403 and "token_file" in body["error"]
        os.kill(dep.daemon.pid if dep.daemon else 0, signal.SIGTERM)


def test_sighup_reloads_the_config_and_keeps_the_old_one_when_invalid(tmp_path: Path) -> None:
    """SIGHUP: an invalid config is rejected (old one kept); a valid change applies at the next launch."""
    with deployment(tmp_path) as dep:
        daemon = dep.start()
        first = dep.wait(serving, what="serving")
        good = dep.config_path.read_text()
        dep.config_path.write_text(good.replace("drain_grace_s = 10", "drain_grace_s = -1"))
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for(lambda: "config.reload_rejected" in dep.log_tail(200), 30, "the invalid config rejected")
        dep.config_path.write_text(
            good.replace('"--enable-metrics"', '"--enable-metrics", "--disable-radix-cache"')
        )
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for(lambda: "config.reloaded" in dep.log_tail(200), 30, "the new config loaded")
        assert dep.server()["pid"] == first["pid"], "a reload does not restart anything"
        assert dep.post("/control/restart", {"reason": "apply flags"}, token=dep.token)[0] == 200
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], what="relaunched")
        assert "--disable-radix-cache" in again["argv"]
