"""Rungs live on a simulated server: set with a restart, shown, reset for the next launch; the readiness routes."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.daemon import ROOT, deployment


def serving(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving" and not s.get("unproven")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_rung_set_restart_show_and_reset_through_the_control_api(tmp_path: Path) -> None:
    """A rung set with --restart relaunches with its flags (journaled with who and why); show lists it; a reset
    is pending for the next launch; wrong requests are refused with why; readiness answers per server."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        assert get(dep.url + "/servers/sim/ready")[0] == 200
        assert get(dep.url + "/ready") == (200, "ready: 1 server(s) serving and proven\n")
        assert get(dep.url + "/servers/nope/ready")[0] == 404
        rung = {"server": "sim", "action": "set", "ladder": "collective_hang", "level": 1}
        assert dep.post("/control/rung", rung)[0] == 401
        assert dep.post("/control/rung", {**rung, "server": "nope"}, token=dep.token)[0] == 404
        status, body = dep.post("/control/rung", {**rung, "ladder": "nope"}, token=dep.token)
        assert status == 400 and "collective_hang" in body["error"]
        status, body = dep.post("/control/rung", {**rung, "level": 9}, token=dep.token)
        assert status == 400 and "has 3 rung(s)" in body["error"]

        token = tmp_path / "token"
        done = cli("rung", "set", "--server", "sim", "--ladder", "collective_hang", "--level", "1", "--restart",
                   "--reason", "INC-7 known desync", "--url", dep.url, "--token-file", str(token))  # fmt: skip
        assert done.returncode == 0, done.stderr
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=90, what="relaunched")
        assert "--disable-overlap-schedule" in again["argv"]
        assert again["flags"]["added"] == [["--disable-overlap-schedule", []]]
        assert [(r["key"], r["level"]) for r in again["fallback"]["rungs"]] == [("collective_hang", 1)]
        journal = (tmp_path / "state" / "incidents.jsonl").read_text()
        assert '"rung collective_hang 1"' in journal and "INC-7 known desync" in journal

        shown = cli("rung", "show", "--server", "sim", "--url", dep.url)
        assert (
            "collective_hang: rung 1 of 3" in shown.stdout
            and "* 1: add --disable-overlap-schedule" in shown.stdout
        )

        done = cli("rung", "reset", "--server", "sim", "--reason", "fixed", "--url", dep.url,
                   "--token-file", str(token))  # fmt: skip
        assert done.returncode == 0, done.stderr
        pending = dep.wait(lambda s: s["next_launch"]["pending"], what="the reset pending")
        assert pending["pid"] == again["pid"] and pending["fallback"]["levels"] == {}
        assert pending["next_launch"]["removed"] == [["--disable-overlap-schedule", []]]
        screen = cli("status", "--url", dep.url).stdout
        assert "next launch: -(--disable-overlap-schedule)  (takes effect at next launch)" in screen
