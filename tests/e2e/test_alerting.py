"""A simulated wedge pages a real Alertmanager through the daemon, and the recovery resolves it."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Traffic, deployment
from tests.support.prometheus import Alertmanager
from tests.support.wait import wait_for

CONFIG: dict[str, Any] = {
    "route": {"receiver": "blackhole", "group_wait": "0s"},
    "receivers": [{"name": "blackhole"}],
}


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager on 127.0.0.1 (clustering off, temp storage), up; yields its base URL."""
    server = Alertmanager(tmp_path / "alertmanager")
    server.start(CONFIG)
    try:
        yield server.url
    finally:
        server.stop()


def alerts(base: str) -> list[dict[str, Any]]:
    """Alertmanager's active alerts ([] when they cannot be read)."""
    with (
        contextlib.suppress(OSError, ValueError),
        urllib.request.urlopen(f"{base}/api/v2/alerts", timeout=5) as r,
    ):
        return list(json.loads(r.read()))
    return []


def test_wedge_fires_in_alertmanager_and_recovery_resolves_it(tmp_path: Path, alertmanager: str) -> None:
    """overlap_tp_desync_hang → an active alert with runbook_url in Alertmanager → resolved once serving again."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('[[fault]]\nname = "overlap_tp_desync_hang"\nafter_requests = 6\n')
    env = {"SGLANG_SIM_SCENARIO": str(scenario)}
    with deployment(tmp_path, env=env, probes={"stall_after_s": 4}, alertmanager_url=alertmanager) as dep:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", what="serving")
        with Traffic(dep.sim_url, dep.model):
            firing = wait_for(
                lambda: [a for a in alerts(alertmanager) if a["labels"].get("server") == "sim"], 90, "firing"
            )
        labels, annotations = firing[0]["labels"], firing[0]["annotations"]
        assert labels["fault"] in ("collective_hang", "decode_wedge") and "runbook_url" in annotations
        dep.wait(lambda s: s["state"] == "serving" and s["pid"] != first["pid"], timeout=90, what="recovered")
        wait_for(
            lambda: not [a for a in alerts(alertmanager) if a["labels"].get("server") == "sim"],
            60,
            "resolved",
        )
